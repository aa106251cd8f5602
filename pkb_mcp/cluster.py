"""Scheduler jobs on a Ray cluster (`pkb serve --ray`, `pkb eval --ray`): docs/scale-out.md.

One scheduler job (check, bench) runs on one node of the cluster: a one-bundle STRICT_PACK placement
group holds its GPUs there, and a detached, named actor in that bundle runs the same service function
the server would, with that node's sandbox backend, warm pool and extension cache. The candidate's
source travels as text. The actor keeps its result until the server has fetched it, so a restarted
server collects jobs that ran on. Ray is imported only here, and only on this path (the `ray` extra).

Imports the scheduler's runners and the service on the node; on the server, the store's file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkb_mcp.errors import Cancelled, UserError
from pkb_mcp.log import get

log = get(__name__)

NAMESPACE = "pkb"
POLL_S = 0.5
MAX_NODE_LOSSES = 2  # a node lost mid-job re-queues it once; the second loss is reported
REMOTE_KINDS = ("check", "bench")
WHOLE_NODE_KINDS = ("bench", "profile")  # timed: the node's GPUs to themselves, as on one node
MAX_SOURCE_BYTES = 1 << 20  # service.MAX_SOLUTION_BYTES; a larger file is refused by the service anyway
PLACEMENT_WAIT_S = 5.0
PRIVATE_SETTINGS = ("PKB_TOKEN",)  # the server's secrets: never into a runtime env the cluster shows

SCHEMA = """
CREATE TABLE IF NOT EXISTS ray_jobs (
    job_id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    placement TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,  -- how many times its node was lost
    starts INTEGER NOT NULL DEFAULT 1,  -- actors started for it (an attached one is not started)
    node TEXT,
    gpus TEXT
)
"""


class NodeLost(RuntimeError):
    """The node (or the actor) running a job died before the job ended."""


@dataclass
class RemoteEnd:
    """How a cluster job ended, as its actor reported it (or the loss of its node)."""

    state: str  # done, failed, cancelled, detached (the server stops; the job runs on)
    result: dict[str, Any] | None = None
    error: str = ""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UserError(
            "--ray needs Ray on this machine and on the cluster's nodes; pip install 'pkb-mcp[ray]'"
        ) from exc
    return ray


def actor_name(job_id: str) -> str:
    return f"pkb-job-{job_id}"


def placement_name(job_id: str) -> str:
    return f"pkb-pg-{job_id}"


class RayJobTable:
    """The cluster side of each job in the scheduler's SQLite file: its Ray names, attempts, node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        with self._lock:
            db = sqlite3.connect(path, timeout=30, isolation_level=None)
            try:
                db.execute(SCHEMA)
            finally:
                db.close()

    def _do(self, sql: str, args: tuple) -> list[tuple]:
        with self._lock:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                return db.execute(sql, args).fetchall()
            finally:
                db.close()

    def started(self, job_id: str) -> None:
        """Record the job's Ray names (a new attempt clears where the last one ran)."""
        self._do(
            "INSERT INTO ray_jobs (job_id, actor, placement) VALUES (?, ?, ?) "
            "ON CONFLICT(job_id) DO UPDATE SET node = NULL, gpus = NULL, starts = starts + 1",
            (job_id, actor_name(job_id), placement_name(job_id)),
        )

    def lost(self, job_id: str) -> int:
        """Count one more loss of the job's node; returns how many there were."""
        self._do("UPDATE ray_jobs SET attempts = attempts + 1 WHERE job_id=?", (job_id,))
        rows = self._do("SELECT attempts FROM ray_jobs WHERE job_id=?", (job_id,))
        return int(rows[0][0]) if rows else 1

    def losses(self, job_id: str) -> int:
        rows = self._do("SELECT attempts FROM ray_jobs WHERE job_id=?", (job_id,))
        return int(rows[0][0]) if rows else 0

    def starts(self, job_id: str) -> int:
        rows = self._do("SELECT starts FROM ray_jobs WHERE job_id=?", (job_id,))
        return int(rows[0][0]) if rows else 0

    def placed(self, job_id: str, node: str, gpus: list[int]) -> None:
        self._do("UPDATE ray_jobs SET node=?, gpus=? WHERE job_id=?", (node, json.dumps(gpus), job_id))

    def where(self, job_id: str) -> tuple[str | None, list[int]]:
        """The node id and node-local GPU ids of the job's latest attempt (None before it started)."""
        rows = self._do("SELECT node, gpus FROM ray_jobs WHERE job_id=?", (job_id,))
        if not rows or rows[0][0] is None:
            return None, []
        return rows[0][0], json.loads(rows[0][1] or "[]")


class _Driver:
    """The actor on a node: runs one scheduler job there, in a thread, and keeps how it ended."""

    def __init__(self, kind: str, params: dict[str, Any], source: str | None, source_name: str) -> None:
        import ray

        self.cancel_event = threading.Event()
        self.progress: tuple[float, float | None, str] = (0.0, None, "started on a cluster node")
        self.end: dict[str, Any] | None = None
        self.node = ray.get_runtime_context().get_node_id()
        self.gpus = [int(g) for g in ray.get_gpu_ids()]
        # outlives this process: if the node's Ray kills it, its sandboxes are killed too
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "pkb_mcp.cluster", "reap", str(os.getpid())],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        threading.Thread(
            target=self._run, args=(kind, dict(params), source, source_name), daemon=True
        ).start()

    def _run(self, kind: str, params: dict[str, Any], source: str | None, source_name: str) -> None:
        from pkb_mcp.scheduler import RUNNERS

        folder = Path(tempfile.mkdtemp(prefix="pkb-ray-src-"))
        try:
            if source is not None:
                path = folder / Path(source_name).name
                path.write_text(source, encoding="utf-8")
                params["path"] = str(path)
            else:
                params["path"] = str(folder / "missing" / Path(source_name).name)
            world_size = int(params.get("world_size", 1))
            if params.get("device") == "cuda":
                params["gpus"] = self.gpus[:world_size]
            else:
                params.pop("gpus", None)

            def progress(done: float, total: float | None, message: str) -> None:
                self.progress = (done, total, message)

            try:
                result = RUNNERS[kind](params, progress, self.cancel_event)
                self.end = {"state": "done", "result": result.model_dump(mode="json")}
            except Cancelled as exc:
                self.end = {"state": "cancelled", "error": str(exc)}
            except UserError as exc:
                self.end = {"state": "failed", "error": str(exc)}
            except Exception as exc:  # a bug of ours on the node: say so, keep the actor answering
                why = f"internal error on a cluster node: {type(exc).__name__}: {exc}"
                self.end = {"state": "failed", "error": why}
        finally:
            for p in folder.rglob("*"):
                p.unlink(missing_ok=True)
            folder.rmdir()

    def poll(self) -> dict[str, Any]:
        return {"progress": self.progress, "end": self.end, "node": self.node, "gpus": self.gpus}

    def cancel(self) -> None:
        self.cancel_event.set()


class RayCluster:
    """The server's handle on a Ray cluster: admission, placement, attach-or-start, collection."""

    def __init__(self, address: str, env: dict[str, str] | None = None) -> None:
        ray = _ray()
        self.address = address
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="warning")
        # the nodes import the same pkb; the server's checkout first on the path (a local cluster, CI)
        root = str(Path(__file__).resolve().parent.parent)
        passed = {k: v for k, v in os.environ.items() if k.startswith("PKB_") and k not in PRIVATE_SETTINGS}
        self.env = {**passed, "PYTHONPATH": root, **(env or {})}
        self._driver_class = ray.remote(max_restarts=0, max_concurrency=4)(_Driver)

    # ------------------------------------------------------------ admission

    def node_gpus(self) -> list[int]:
        """GPUs of each alive node (logical GPUs count: CI's cluster has them)."""
        ray = _ray()
        return [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]

    def gpus_needed(self, kind: str, world_size: int) -> int:
        largest = max(self.node_gpus(), default=0)
        return max(world_size, largest) if kind in WHOLE_NODE_KINDS else world_size

    def admit(self, kind: str, params: dict[str, Any]) -> None:
        """Refuse at submit what no node can hold: one clear sentence with the fix."""
        if kind == "profile":
            raise UserError(
                "profile does not run on a Ray cluster yet (its trace files stay on the node); "
                "run pkb profile on a GPU node without --ray"
            )
        world_size = int(params.get("world_size", 1))
        sizes = self.node_gpus()
        largest = max(sizes, default=0)
        if world_size > largest:
            raise UserError(
                f"world size {world_size} needs {world_size} GPUs on one node and the largest node of "
                f"the Ray cluster at {self.address} has {largest} ({len(sizes)} nodes alive); "
                f"pass --world-size {largest} or fewer, or add a larger node"
            )

    # ------------------------------------------------------------ running

    def _find(self, job_id: str) -> Any:
        ray = _ray()
        try:
            return ray.get_actor(actor_name(job_id), namespace=NAMESPACE)
        except ValueError:
            return None

    def _placement(self, job_id: str, gpus: int) -> Any:
        from ray.util.placement_group import placement_group

        return placement_group(
            [{"GPU": gpus, "CPU": 1}],
            strategy="STRICT_PACK",
            name=placement_name(job_id),
            lifetime="detached",
        )

    def _start(self, job_id: str, kind: str, params: dict[str, Any], cancel: threading.Event) -> Any:
        """A new placement group and actor for the job; None when cancelled while waiting for room."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.gpus_needed(kind, int(params.get("world_size", 1)))
        self._remove_placement(job_id)  # one a lost node left behind would hold its GPUs forever
        group = self._placement(job_id, gpus)
        while not _ray().wait([group.ready()], timeout=PLACEMENT_WAIT_S)[0]:
            if cancel.is_set():  # cancelled, or the server stops: nothing started yet
                self._remove_placement(job_id)
                return None
        path = params.get("path")
        source = _read_source(Path(path)) if path else None
        return self._driver_class.options(
            name=actor_name(job_id),
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=1,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=0
            ),
            runtime_env={"env_vars": self.env},
        ).remote(kind, params, source, Path(path).name if path else "solution.py")

    def run(
        self,
        job_id: str,
        kind: str,
        params: dict[str, Any],
        table: RayJobTable,
        cancel: threading.Event,
        stopping: Callable[[], bool],
        progress: Callable[[float, float | None, str], None],
        placed_at: Callable[[], None] = lambda: None,
    ) -> RemoteEnd:
        """Attach to the job's actor (a previous server's) or start one, and follow it to its end;
        `placed_at()` once it holds its node (a deadline counts from there, not from the wait for
        room). Raises NodeLost when the actor or its node dies first."""
        ray = _ray()
        actor = self._find(job_id)
        if actor is not None:
            log.info("ray.attached", job=job_id)
        else:
            table.started(job_id)
            actor = self._start(job_id, kind, params, cancel)
            if actor is None:
                if stopping():
                    return RemoteEnd("detached")
                return RemoteEnd("cancelled", error="cancelled while waiting for a node with room")
            log.info("ray.started", job=job_id)
        placed = False
        cancel_sent = False
        while True:
            if cancel.is_set() and not cancel_sent:
                if stopping():
                    return RemoteEnd("detached")  # the next server collects it
                with contextlib.suppress(Exception):  # a dead actor: the poll below says so
                    actor.cancel.remote()
                cancel_sent = True
            try:
                state = ray.get(actor.poll.remote(), timeout=60)
            except Exception as exc:  # ActorDiedError, ActorUnavailableError, GetTimeoutError, node death
                self._release(job_id, actor)
                raise NodeLost(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
            if not placed:
                table.placed(job_id, state["node"], state["gpus"])
                placed = True
                placed_at()
            progress(*state["progress"])
            end = state["end"]
            if end is not None:
                self._release(job_id, actor)
                if end["state"] == "done":
                    return _validated(kind, end.get("result"))
                return RemoteEnd(end["state"], None, str(end.get("error") or "")[:4000])
            time.sleep(POLL_S)

    def _release(self, job_id: str, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            _ray().kill(actor, no_restart=True)
        self._remove_placement(job_id)

    def _remove_placement(self, job_id: str) -> None:
        from ray.util.placement_group import get_placement_group, remove_placement_group

        with contextlib.suppress(Exception):  # none of that name: nothing to free
            remove_placement_group(get_placement_group(placement_name(job_id)))


def _validated(kind: str, result: Any) -> RemoteEnd:
    """A node's result, re-read through the server's own model of it: anything else is a failure."""
    from pydantic import ValidationError

    from pkb_mcp.models import BenchResult, CheckResult

    model: type[CheckResult] | type[BenchResult] = CheckResult if kind == "check" else BenchResult
    try:
        return RemoteEnd("done", model.model_validate(result).model_dump(mode="json"))
    except ValidationError as exc:
        return RemoteEnd("failed", error=f"the cluster node returned no valid {kind} result: {exc}"[:4000])


def _read_source(path: Path) -> str | None:
    """The candidate's source as text for the node, at most one byte over the service's limit (so the
    service there refuses an oversized file as it would here); None when missing."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SOURCE_BYTES + 1).decode("utf-8", "replace")
    except OSError:
        return None


# ---------------------------------------------------------------- the reaper beside each actor


def _children_sessions(owner: int) -> dict[int, str]:
    """The owner's children that lead a session of their own (the process backend's launchers), with
    the job marker each carries."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            pid, ppid, session = int(entry.name), int(fields[1]), int(fields[3])
            if ppid != owner or session != pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            marker = next((v.decode() for v in env if v.startswith(b"PKB_LAUNCH=")), "")
            found[pid] = marker
        except (OSError, ValueError, IndexError):
            continue
    return found


def reap(owner: int, poll_s: float = 0.5) -> None:
    """Wait for the actor process `owner` to end; then kill what its launches left: the process
    backend's sessions (by session and job marker) and the Docker containers whose owner is gone."""
    seen: dict[int, str] = {}
    while True:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        seen.update(_children_sessions(owner))
        time.sleep(poll_s)
    from sandbox.process import kill_launch

    for session, marker in seen.items():
        kill_launch(session, marker or f"PKB_SESSION={session}")
    with contextlib.suppress(Exception):  # no engine or no SDK here: no containers either
        import docker

        from sandbox.docker import sweep

        sweep(docker.from_env(timeout=10))


if __name__ == "__main__" and sys.argv[1:2] == ["reap"]:
    reap(int(sys.argv[2]))
