"""Job state in an embedded SQLite database: what was asked, where it stands, what came out.

One row per job. Its run request and result are JSON; the store neither knows nor validates their
shape (the scheduler does). Safe to use from several threads and processes (pkb_mcp/sqlite_file.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from pkb_mcp.models import Result
from pkb_mcp.sqlite_file import SQLiteFile

TERMINAL = ("done", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    progress REAL NOT NULL DEFAULT 0,
    total REAL,
    message TEXT NOT NULL DEFAULT '',
    error TEXT,
    result TEXT
)
"""


class JobRecord(Result):
    id: str
    kind: str = Field(description="compile, check, bench or profile")
    state: str = Field(description="queued, running, done, failed or cancelled")
    created: float
    started: float | None = None
    finished: float | None = None
    progress: float = 0.0
    total: float | None = None
    message: str = Field("", description="the latest progress message")
    error: str | None = None  # why the job failed or was cancelled
    # the request, kept in the store and left out of what a tool returns (and of its schema)
    params: SkipJsonSchema[dict[str, Any]] = Field(default_factory=dict, exclude=True)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class JobStore:
    def __init__(self, path: Path):
        self.path = path
        self.db = SQLiteFile(path, SCHEMA)

    def create(self, job_id: str, kind: str, params: dict[str, Any]) -> None:
        self.db.write(
            "INSERT INTO jobs (id, kind, params, state, created) VALUES (?, ?, ?, 'queued', ?)",
            (job_id, kind, json.dumps(params), time.time()),
        )

    def started(self, job_id: str) -> None:
        self.db.write("UPDATE jobs SET state='running', started=? WHERE id=?", (time.time(), job_id))

    def progress(self, job_id: str, progress: float, total: float | None, message: str) -> None:
        self.db.write(
            "UPDATE jobs SET progress=?, total=?, message=? WHERE id=?", (progress, total, message, job_id)
        )

    def finish(
        self, job_id: str, state: str, result: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        assert state in TERMINAL
        self.db.write(
            "UPDATE jobs SET state=?, finished=?, result=?, error=? WHERE id=?",
            (state, time.time(), json.dumps(result) if result is not None else None, error, job_id),
        )

    def requeue(self, job_id: str) -> None:
        self.db.write(
            "UPDATE jobs SET state='queued', started=NULL, progress=0, message=? WHERE id=?",
            ("re-queued after a server restart", job_id),
        )

    def get(self, job_id: str) -> JobRecord | None:
        rows = self.db.read("SELECT * FROM jobs WHERE id=?", (job_id,))
        return _record(rows[0]) if rows else None

    def result(self, job_id: str) -> dict[str, Any] | None:
        rows = self.db.read("SELECT result FROM jobs WHERE id=?", (job_id,))
        return json.loads(rows[0]["result"]) if rows and rows[0]["result"] else None

    def every(self, kinds: tuple[str, ...] = ()) -> list[JobRecord]:
        """Every job (of `kinds`, where given), in the order they were submitted."""
        rows = self.db.read("SELECT * FROM jobs ORDER BY created")
        return [_record(r) for r in rows if not kinds or r["kind"] in kinds]

    def unfinished(self) -> list[JobRecord]:
        rows = self.db.read("SELECT * FROM jobs WHERE state IN ('queued', 'running') ORDER BY created")
        return [_record(r) for r in rows]


def _record(row: sqlite3.Row) -> JobRecord:
    return JobRecord(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        created=row["created"],
        started=row["started"],
        finished=row["finished"],
        progress=row["progress"],
        total=row["total"],
        message=row["message"],
        error=row["error"],
        params=json.loads(row["params"]),
    )
