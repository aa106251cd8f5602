"""Where things live: the problem suite, the cache, launch directories. Environment overrides only.

PKB_PROBLEMS_DIR   the suite (default: problems/ beside the package in a checkout, else the packaged copy)
PKB_CACHE_DIR      compile cache and node calibration (default: $XDG_CACHE_HOME/pkb or ~/.cache/pkb)
PKB_LAUNCH_DIR     where launch directories are made and removed (default: the system temp dir;
                   PKB_JOBS_DIR, its former name, is still read)
PKB_STATE_DIR      the server's job database and submitted sources (default: $XDG_STATE_HOME/pkb or
                   ~/.local/state/pkb)
PKB_ROOTS          the folders a `path` given over MCP may lie in, separated by os.pathsep (as PATH is);
                   `pkb serve --root DIR`, repeated, replaces it (default: the server's working
                   directory at start; the state folder is always one)
PKB_PIN_CPUS       1: each rank runs on CPU cores of its own (sandbox/cpus.py), 0: wherever the
                   kernel puts it (default: 1 for GPU launches, 0 for CPU launches)
PKB_NCU            the Nsight Compute executable a profile's counter launch runs (default: found on PATH
                   or in NVIDIA's install folders, harness/counters.py); PKB_NCU_METRICS, comma-separated,
                   replaces its metric set (docs/nvlink-counters.md)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pkb_mcp.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
HARNESS_ROOT = PACKAGE_DIR.parent  # the folder that holds the `harness` package


def problems_dir() -> Path:
    env = os.environ.get("PKB_PROBLEMS_DIR")
    if env:
        return Path(env)
    checkout = PACKAGE_DIR.parent / "problems"
    return checkout if checkout.is_dir() else PACKAGE_DIR / "_problems"


def cache_dir() -> Path:
    env = os.environ.get("PKB_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pkb"
    base.mkdir(parents=True, exist_ok=True)
    return base


def extensions_dir() -> Path:
    """The node's extension cache: built by build launches, read-only to every other launch."""
    path = cache_dir() / "extensions"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    return path


def launches_dir() -> Path:
    # PKB_JOBS_DIR: the setting's name before launches were called launches, still honoured
    path = Path(os.environ.get("PKB_LAUNCH_DIR") or os.environ.get("PKB_JOBS_DIR") or tempfile.gettempdir())
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_path() -> Path:
    """Where the state folder is (PKB_STATE_DIR, else XDG_STATE_HOME/pkb), not made."""
    env = os.environ.get("PKB_STATE_DIR")
    return (
        Path(env) if env else Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "pkb"
    )


def state_dir() -> Path:
    base = state_path()
    base.mkdir(parents=True, exist_ok=True)
    return base


def mcp_roots(given: Sequence[str] = ()) -> tuple[Path, ...]:
    """The folders a `path` given over MCP may lie in, resolved (frontends/server.py adds its state
    folder): `given` (pkb serve --root), else PKB_ROOTS, else the working directory now. A folder that
    is not one is a UserError: a typo would otherwise refuse every path."""
    named = list(given) or [
        part for part in os.environ.get("PKB_ROOTS", "").split(os.pathsep) if part.strip()
    ]
    if not named:
        return (Path(os.path.realpath(Path.cwd())),)
    roots = []
    for folder in named:
        root = Path(os.path.realpath(Path(folder).expanduser()))
        if not root.is_dir():
            where = "--root" if given else "PKB_ROOTS"
            raise UserError(f"{where} names {folder}, which is not a folder; name folders that exist")
        roots.append(root)
    return tuple(roots)


def _switch(name: str) -> bool | None:
    """An environment variable that is 0 or 1: its value, None when unset."""
    env = os.environ.get(name, "").strip()
    if env not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, not {env!r}")
    return None if not env else env == "1"


def pin_cpus(device: str) -> bool:
    """Whether a launch's ranks are bound to CPU cores of their own (PKB_PIN_CPUS)."""
    on = _switch("PKB_PIN_CPUS")
    return on if on is not None else device == "cuda"


def unseen_sizes() -> bool:
    """Whether a check that passed also runs one trial at a size never shown (pkb_mcp/runs/unseen.py)
    where its request does not say (PKB_UNSEEN_SIZES=0 turns it off: a node that runs many checks of
    code that is not iterated on, the test suite's own integration tests)."""
    return _switch("PKB_UNSEEN_SIZES") is not False


def unseen_beside() -> bool:
    """Whether a check's unseen-size trial starts beside its judged trials (PKB_UNSEEN_BESIDE=0 turns
    it off: the trial then runs after them; pkb_mcp/runs/unseen.py); in isolated sandboxes at the
    `pkb` size only, whatever this says. On 2 H200s a plain warm check took 0.415 s beside, 0.513 s
    after (docs/gpu-results.md)."""
    return _switch("PKB_UNSEEN_BESIDE") is not False


def precompiled_headers() -> str:
    """Whether extension builds and syntax checks get torch's header, and CUDA units their headers'
    parts, precompiled (PKB_PRECOMPILED_HEADERS; pkb_mcp/compile/headers.py): "auto" (the default) and
    "1" on every node, "0" never (the test suite, whose every test has a cache of its own)."""
    env = os.environ.get("PKB_PRECOMPILED_HEADERS", "").strip() or "auto"
    if env not in ("auto", "0", "1"):
        raise ValueError(f"PKB_PRECOMPILED_HEADERS must be auto, 0 or 1, not {env!r}")
    return env


def warm_per_shape(device: str) -> int:
    """How many warm sandboxes the pool keeps of each launch shape (PKB_WARM_PER_SHAPE; sandbox/pool.py).
    On GPUs 6: a check runs three launches of one shape at once in isolated sandboxes (its judged
    trials' pair, its unseen-size trial's candidate; at a smaller world size that trial's reference
    too, of another shape), and a benchmark's pair follows a passing check. On CPU 2:
    the cores that sandboxes warming up would take are the running launch's."""
    env = os.environ.get("PKB_WARM_PER_SHAPE", "").strip()
    if env and (not env.isdigit() or int(env) < 1):
        raise ValueError(f"PKB_WARM_PER_SHAPE must be a positive integer, not {env!r}")
    return int(env) if env else 6 if device == "cuda" else 2


def warm_spare(device: str, batch: bool) -> int:
    """How many more sandboxes of a GPU shape the pool keeps staged but closed (PKB_WARM_SPARE;
    sandbox/pool.py). In a batch 6, a check's three launches and a benchmark's two, so that a file
    checked right after another waits only for their GPU step; staged sandboxes hold no GPU memory.
    Elsewhere (`pkb serve`) and on CPU none: a spare opened while a check runs slows it (2 H200s: a
    lone plain check 1.28 s with spares, 1.13 s without; docs/gpu-results.md)."""
    env = os.environ.get("PKB_WARM_SPARE", "").strip()
    if env and not env.isdigit():
        raise ValueError(f"PKB_WARM_SPARE must be a whole number, not {env!r}")
    return int(env) if env else 6 if device == "cuda" and batch else 0


def build_slots() -> int:
    """How many solutions' extensions a batch builds at once (PKB_BUILD_SLOTS, else from the node): a
    build launch runs up to four compilers side by side (harness/build.py), each wanting about 2 GiB."""
    env = os.environ.get("PKB_BUILD_SLOTS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"PKB_BUILD_SLOTS must be a positive integer, not {env!r}")
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        memory_gib = 8.0
    return max(1, min(cores // 4, int(memory_gib // 8)))


def ncu_metrics(default: list[str]) -> list[str]:
    """The metrics a counter launch asks Nsight Compute for: PKB_NCU_METRICS, else `default`."""
    env = os.environ.get("PKB_NCU_METRICS", "").strip()
    if not env:
        return list(default)
    names = [n.strip() for n in env.split(",") if n.strip()]
    bad = [n for n in names if not n.replace("_", "").replace(".", "").isalnum()]
    if bad or not names:
        raise ValueError(f"PKB_NCU_METRICS must name metrics separated by commas, not {env!r}")
    return names
