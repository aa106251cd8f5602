"""What a sandbox backend is handed and gives back (a launch, how it ended), and what every backend
shares: the launch file, the variables and limits of every launch, the warm set-up. The interface
itself is sandbox/backend.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contracts import WarmSetup
from harness.extensions import VIEW
from sandbox.untrusted import LaunchFiles, usage


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
    # a limit of the node's that the launch went past and was killed for, in one sentence (DiskGuard)
    exceeded: str | None = None
    warm: bool = False  # the launch ran in a sandbox started ahead of need
    # seconds from the run's start to each of its steps (the launch file handed over, the launcher's
    # clean end or its exit, the sandbox cleaned up): where a launch's time outside its ranks goes
    steps_s: dict[str, float] = field(default_factory=dict)


# Variables every launch gets: NVLink multicast stays off (it can take a shared host's GPUs out of
# service), output is unbuffered so logs survive a kill, and gloo binds to the loopback interface: a
# launch's ranks share one host, and a sandbox without a network cannot resolve its own hostname, for
# which gloo printed a warning in every rank's log (and so in a failing candidate's result).
LAUNCH_ENV = {
    "GLOO_SOCKET_IFNAME": "lo",
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
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)  # never written through: whatever sits there (a link included) goes first
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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

# ---------------------------------------------------------------- what a launch may take of the node

FILE_SIZE_CAP = 16 << 30  # RLIMIT_FSIZE of every process of a launch: no one file larger
DISK_CAP = 32 << 30  # what a launch folder may hold at most (PKB_LAUNCH_DISK), and a quarter of the free disk
MAX_LAUNCH_ENTRIES = 100_000  # files and folders a launch folder may hold
DISK_POLL_S = 1.0
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "3g", "512m", "1048576" (Docker's way of writing a size)."""
    value = text.strip().lower().removesuffix("b")
    unit = value[-1:] if value[-1:] in _UNITS and not value[-1:].isdigit() else ""
    number = value[: len(value) - len(unit)]
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a size such as 512m or 3g")
    return int(number) * _UNITS[unit]


def launch_disk_cap(launches_dir: Path) -> int:
    """Bytes one launch folder may hold: PKB_LAUNCH_DISK, else the least of DISK_CAP and a quarter of
    the disk left where launches live (at least 1 GiB)."""
    given = os.environ.get("PKB_LAUNCH_DISK", "").strip()
    if given:
        return parse_size(given)
    try:
        free = shutil.disk_usage(launches_dir).free
    except OSError:
        free = DISK_CAP * 4
    return max(1 << 30, min(DISK_CAP, free // 4))


class DiskGuard:
    """Watches a running launch's folder (at most once every DISK_POLL_S): `over()` says, in one
    sentence, that it holds more than its cap or more than MAX_LAUNCH_ENTRIES entries, else None.
    A launch's files sit on the host's disk (a bind mount), so this, with RLIMIT_FSIZE for each file,
    is what bounds them."""

    def __init__(self, launch_dir: Path, cap: int | None = None) -> None:
        self.launch_dir = launch_dir
        self.cap = cap if cap is not None else launch_disk_cap(launch_dir.parent)
        self._next = time.monotonic() + DISK_POLL_S

    def over(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + DISK_POLL_S
        # the launch's view of the cache is the host's hard links: no disk of the launch's
        used, entries = usage(self.launch_dir, MAX_LAUNCH_ENTRIES, skip=(VIEW,))
        if entries > MAX_LAUNCH_ENTRIES:
            return f"the launch made more than {MAX_LAUNCH_ENTRIES} files and folders in its launch folder"
        if used > self.cap:
            return f"the launch wrote more than its launch folder's limit of {_gib(self.cap)} to disk"
        return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def node_memory() -> int:
    """The node's memory in bytes (/proc/meminfo's MemTotal), or 0 where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


MEMORY_CAP = 32 << 30
CONCURRENT_SANDBOXES = 2  # a check's reference and candidate run at once (PKB_SANDBOX_CONCURRENT)


def sandbox_memory() -> int:
    """What one sandbox may hold in memory, its tmpfs folders included (they are charged to it):
    PKB_SANDBOX_MEMORY, else the least of MEMORY_CAP and 80% of the node's memory shared by the
    sandboxes that run at once (PKB_SANDBOX_CONCURRENT, default 2), at least 1 GiB."""
    given = os.environ.get("PKB_SANDBOX_MEMORY", "").strip()
    if given:
        return parse_size(given)
    at_once = max(1, int(os.environ.get("PKB_SANDBOX_CONCURRENT", "") or CONCURRENT_SANDBOXES))
    total = node_memory() or MEMORY_CAP
    return max(1 << 30, min(MEMORY_CAP, int(total * 0.8) // at_once))


LOG_CAP_BYTES = 64 * 1024


def tail(path: Path, limit: int = LOG_CAP_BYTES) -> str:
    """The last `limit` bytes of a log file in a launch directory (`path`'s folder), decoded
    leniently, read through the doorway (sandbox/untrusted.py): "" where it is absent, and the
    refusal's sentence where it is anything but a plain file."""
    files = LaunchFiles(path.parent)
    text = files.tail(path.name, limit)
    return text if not files.refusals else f"({files.refusals[0]})"
