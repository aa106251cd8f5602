"""The one small interface every sandbox backend implements."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.contracts import WarmSetup


@dataclass
class SandboxLaunch:
    """One launch: the harness launcher runs in `launch_dir` and reads `config` from the launch file;
    `warm` is the handle of a sandbox started ahead of need (sandbox/pool.py), else None."""

    launch_id: str
    launch_dir: Path
    config: Mapping[str, Any]  # a LaunchConfig (harness/contracts.py), or a tool launch's configuration
    device: str
    gpus: list[int]
    timeout_s: float
    harness_root: Path
    threads: int = 1
    cpus: tuple[tuple[int, ...], ...] = ()  # each rank's CPU cores (sandbox/cpus.py); () = not pinned
    warm: Any = None
    # Says, from the launch directory, that the launcher has finished cleanly: its record written
    # and nothing of the candidate left running (pkb_mcp/launches.py `ended_cleanly`). A backend
    # whose sandbox takes long to end (a container: `ends_early`) may then return without waiting
    # for that end and stop the sandbox later. None: wait for it.
    ended: Callable[[Path], bool] | None = None


@dataclass
class SandboxRun:
    """How the launcher itself ended (each rank's outcome is in the launch dir's launch.json)."""

    exit_code: int | None
    wall_s: float
    killed_at_deadline: bool
    launcher_log: str
    cancelled: bool = False
    warm: bool = False  # the launch ran in a sandbox started ahead of need
    # seconds from the run's start to each of its steps (the launch file handed over, the launcher's
    # clean end or its exit, the sandbox cleaned up): where a launch's time outside its ranks goes
    steps_s: dict[str, float] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    isolated: bool
    note: str

    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        """Run the launch to its end, its deadline, or until `cancel` is set; always clean up."""
        ...


# Variables every launch gets: NVLink multicast stays off (it can take a shared host's GPUs out of
# service), output is unbuffered so logs survive a kill.
LAUNCH_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "LANG": "C.UTF-8",
}

CONFIG_NAME = ".launch-config"
WARM_IDLE_S = 600.0


def write_config(launch_dir: Path, config: Mapping[str, Any], owner: tuple[int, int] | None = None) -> None:
    """The launch file the launcher reads and deletes before any candidate code exists. It appears
    whole (a rename): a warm launcher polls for it."""
    part = launch_dir / (CONFIG_NAME + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(config))
    if owner is not None:
        with contextlib.suppress(PermissionError):
            os.chown(part, *owner)
    os.replace(part, launch_dir / CONFIG_NAME)


def warm_setup(
    launch_dir: Path | str,
    world_size: int,
    device: str,
    threads: int,
    cpus: tuple[tuple[int, ...], ...] = (),
    gated: bool = False,
) -> WarmSetup:
    """What a warm launcher starts its workers with: nothing secret. `gated`: its ranks touch no GPU
    until the host opens the sandbox (sandbox/pool.py)."""
    setup: WarmSetup = {
        "launch_dir": str(launch_dir),
        "world_size": world_size,
        "device": device,
        "threads_per_rank": threads,
        "rank_cpus": [list(block) for block in cpus],
        "setup_timeout_s": 300.0,
        "idle_s": WARM_IDLE_S,
    }
    if gated:
        setup["gated"] = True
    return setup


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
