"""Shared fixtures: every test gets its own launch and cache directories, so leftovers are visible."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pkb_mcp.models import Ceilings

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = Path(__file__).resolve().parent / "candidates"


TIERS = ("integration", "contract", "gpu")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in none of the other tiers is in the fast tier: `python -m pytest -m fast`."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    launches = tmp_path / "launches"
    launches.mkdir()
    monkeypatch.setenv("PKB_LAUNCH_DIR", str(launches))
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))
    # a passing check's trial at an unseen size costs two launches more: the tests that pass a check
    # skip it (CI has an hour), those of tests/test_unseen.py ask for it
    monkeypatch.setenv("PKB_UNSEEN_SIZES", "0")
    # torch's precompiled header is about 0.8 GB and a minute of a core, made once per node's cache: a
    # test's cache is its own, so only the tests of the header ask for it
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "0")
    return launches


@pytest.fixture
def small_docker_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Container limits that a 2-core, 24 GiB CI machine can give several launches at once."""
    monkeypatch.setenv("PKB_SANDBOX_MEMORY", "3g")
    monkeypatch.setenv("PKB_SANDBOX_PIDS", "256")
    monkeypatch.setenv("PKB_SANDBOX_SHM", "256m")


def wait_for(
    predicate: Callable[[], object], timeout_s: float = 120, what: str = "", poll_s: float = 0.2
) -> None:
    """Return once `predicate()` is true; fail the test, naming `what`, after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def launch_processes(launches_dir: Path) -> list[int]:
    """Processes still carrying the pkb marker of a launch made under `launches_dir` (none may survive)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"PKB_LAUNCH=" in environ and str(launches_dir).encode() in environ:
            found.append(int(entry.name))
    return [p for p in found if p != os.getpid()]


# Round figures for roofline tests: 400 MB over NVLink take 1 ms, over HBM 0.1 ms.
CEIL = Ceilings(
    nvlink_gbps=400.0,
    hbm_gbps=4000.0,
    tflops={"bfloat16": 800.0, "float32": 60.0},
    round_latency_us=5.0,
    source="test",
)


def docker_client():
    """A client of the local Docker engine, or None when none answers. With PKB_REQUIRE_DOCKER=1 (CI)
    a missing engine is an error, so Docker tests fail there rather than skip."""
    try:
        from sandbox.docker import connect

        return connect()
    except Exception as exc:  # no engine here
        if os.environ.get("PKB_REQUIRE_DOCKER") == "1":
            raise RuntimeError(f"PKB_REQUIRE_DOCKER=1 but {exc}") from exc
        return None


def cpu_launch(
    mode: str = "outputs",
    solution: Path | None = None,
    world_size: int = 2,
    seeds: list[int] | None = None,
    timing: dict | None = None,
    timeout_s: float = 60,
):
    """A launch of problem 1 (all-reduce) on CPU: the reference itself unless `solution` is given."""
    import secrets

    from pkb_mcp import problems
    from pkb_mcp.launches import LaunchRequest

    p = problems.resolve(1)
    settings = {
        "mode": mode,
        "world_size": world_size,
        "device": "cpu",
        "size": p.size("pkb"),
        "dtype": p.dtype,
        "seeds": seeds or [secrets.randbits(62)],
        "tolerance": p.tolerance,
        "timeout_s": timeout_s,
        "timing": timing,
        "threads_per_rank": 1,
        "convention": "auto",
    }
    return LaunchRequest(settings, p.path, solution or p.path, gpus=[])
