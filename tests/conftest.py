"""Shared fixtures: every test gets its own job and cache directories, so leftovers are visible."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = Path(__file__).resolve().parent / "candidates"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setenv("PKB_JOBS_DIR", str(jobs))
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))
    return jobs


def job_processes(jobs_dir: Path) -> list[int]:
    """Processes still carrying a pkb job marker of a job made under `jobs_dir` (none may survive)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"PKB_JOB=" in environ and str(jobs_dir).encode() in environ:
            found.append(int(entry.name))
    return [p for p in found if p != os.getpid()]
