"""Where `pkb eval` keeps its per-file results, so that an interrupted batch resumes.

A table beside the scheduler's jobs table, in the same SQLite file: one row per (file content,
problem, run settings), holding the check and benchmark job ids while they run and the file's result
once it has one. A re-run finds finished rows and skips them; rows still checking or benchmarking
point at jobs the restarted scheduler re-queued, which the batch adopts instead of submitting again.
One batch at a time per store: a lock file refuses a second.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from pkb_mcp.errors import UserError
from pkb_mcp.sqlite_file import SQLiteFile

SCHEMA = """
CREATE TABLE IF NOT EXISTS eval_results (
    key TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    state TEXT NOT NULL,
    check_job TEXT,
    bench_job TEXT,
    result TEXT,
    updated REAL NOT NULL
)
"""
STATES = ("checking", "benchmarking", "done")


class EvalStore:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file: Any = None
        self.db = SQLiteFile(path, SCHEMA)

    def acquire(self) -> None:
        """Hold the store for this batch, or say which other batch holds it."""
        handle = open(self.path.with_name(self.path.name + ".lock"), "a+")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise UserError(
                f"another pkb eval is using {self.path}; wait for it, or pass --store with another file"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_file = handle

    def release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def get(self, key: str) -> dict[str, Any] | None:
        rows = self.db.read("SELECT * FROM eval_results WHERE key=?", (key,))
        if not rows:
            return None
        row = rows[0]
        out = dict(row)
        out["result"] = json.loads(row["result"]) if row["result"] else None
        return out

    def put(
        self,
        key: str,
        file: str,
        state: str,
        check_job: str | None = None,
        bench_job: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        assert state in STATES
        self.db.write(
            "INSERT OR REPLACE INTO eval_results"
            " (key, file, state, check_job, bench_job, result, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, file, state, check_job, bench_job, json.dumps(result) if result else None, time.time()),
        )

    def forget(self, key: str) -> None:
        self.db.write("DELETE FROM eval_results WHERE key=?", (key,))
