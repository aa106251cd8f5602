"""The one small interface every sandbox backend implements."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class SandboxJob:
    """One job: the harness launcher runs in `job_dir` with `config` on its stdin."""

    job_id: str
    job_dir: Path
    config: dict[str, Any]
    device: str
    gpus: list[int]
    timeout_s: float
    harness_root: Path
    threads: int = 1
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SandboxRun:
    """How the launcher itself ended (each rank's fate is in the job dir's launch.json)."""

    exit_code: int | None
    wall_s: float
    killed_at_deadline: bool
    launcher_log: str
    cancelled: bool = False


class Backend(Protocol):
    name: str
    isolated: bool
    note: str

    def run(self, job: SandboxJob, cancel: threading.Event | None = None) -> SandboxRun:
        """Run the job to its end, its deadline, or until `cancel` is set; always clean up."""
        ...


# Variables every job gets: NVLink multicast stays off (it can take a shared host's GPUs out of
# service), output is unbuffered so logs survive a kill.
JOB_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "LANG": "C.UTF-8",
}

OUTER_GRACE_S = 10.0  # the launcher enforces the deadline itself; this is the backstop
LOG_CAP_BYTES = 64 * 1024


def tail(path: Path, limit: int = LOG_CAP_BYTES) -> str:
    """The last `limit` bytes of a log file, decoded leniently."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
