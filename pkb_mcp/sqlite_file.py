"""One SQLite file that threads and processes share, with the connection settings every store of pkb
uses: the job store (pkb_mcp/jobs/store.py), the Ray job table beside it (pkb_mcp/jobs/cluster.py)
and the eval store (pkb_mcp/evaluation/store.py).

Each call opens its own short connection in autocommit mode (a connection is not shared between
threads), waits up to 30 s for another process's lock, and reads rows by column name. Writes of one
process go one at a time; the file is in WAL mode so readers do not wait for them.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_S = 30.0


class SQLiteFile:
    def __init__(self, path: Path, *schema: str) -> None:
        """Open (or create) the file and run each `schema` statement once."""
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._lock, self.connection() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in schema:
                db.execute(statement)

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    def write(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """One statement that changes the file, after this process's other writers; its rows."""
        with self._lock, self.connection() as db:
            return db.execute(sql, args).fetchall()

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self.connection() as db:
            return db.execute(sql, args).fetchall()
