"""Scheduler jobs on a Ray cluster (`pkb serve --ray`, `pkb eval --ray`): docs/scale-out.md.

One scheduler job (check, bench, profile) runs on one node of the cluster: a one-bundle STRICT_PACK
placement group holds its GPUs there, and a detached, named actor in that bundle (the job's lease)
hands the job to its node's long-lived actor (pkb_mcp/jobs/cluster_node.py), which runs the same service
function the server would, with that node's sandbox backend, warm pool and extension cache. The
candidate's source travels as text. The node keeps the job's end (a profile's trace and timeline as
bytes with it) until the server has fetched it through the lease, so a restarted server collects jobs
that ran on; the server writes a profile's artifacts under its own profiles folder. Ray is imported
only on this path (the `ray` extra).

On the server: the store's file; the reaper runs beside each node's actor.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pkb_mcp.errors import UserError
from pkb_mcp.jobs.cluster_node import NAMESPACE
from pkb_mcp.log import get
from pkb_mcp.service import VERBS, Verb
from pkb_mcp.sqlite_file import SQLiteFile

if TYPE_CHECKING:
    from pkb_mcp.models import RunRequest

log = get(__name__)

POLL_S = 0.5
MAX_NODE_LOSSES = 2  # a node lost mid-job re-queues it once; the second loss is reported
MAX_SOURCE_BYTES = 1 << 20  # service.MAX_SOLUTION_BYTES; a larger file is refused by the service anyway
PLACEMENT_WAIT_S = 5.0
PRIVATE_SETTINGS = ("PKB_TOKEN",)  # the server's secrets: never into a runtime env the cluster shows

SCHEMA = """
CREATE TABLE IF NOT EXISTS ray_jobs (
    job_id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    placement TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,  -- how many times its node was lost
    starts INTEGER NOT NULL DEFAULT 1,  -- leases started for it (an attached one is not started)
    node TEXT,
    gpus TEXT,
    warm INTEGER  -- its launches that ran in a warm sandbox of the node (known once it ended)
)
"""
WARM_COLUMN = "ALTER TABLE ray_jobs ADD COLUMN warm INTEGER"  # a store made before the column


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
        self.db = SQLiteFile(path, SCHEMA)
        with contextlib.suppress(sqlite3.OperationalError):  # it has the column already
            self.db.write(WARM_COLUMN)

    def _do(self, sql: str, args: tuple) -> list[sqlite3.Row]:
        return self.db.write(sql, args)

    def started(self, job_id: str) -> None:
        """Record the job's Ray names (a new attempt clears where the last one ran)."""
        self._do(
            "INSERT INTO ray_jobs (job_id, actor, placement) VALUES (?, ?, ?) "
            "ON CONFLICT(job_id) DO UPDATE SET node = NULL, gpus = NULL, warm = NULL, starts = starts + 1",
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

    def warmed(self, job_id: str, launches: int) -> None:
        self._do("UPDATE ray_jobs SET warm=? WHERE job_id=?", (launches, job_id))

    def warm(self, job_id: str) -> int | None:
        """How many of the job's launches ran in a warm sandbox (None before it ended)."""
        rows = self._do("SELECT warm FROM ray_jobs WHERE job_id=?", (job_id,))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def where(self, job_id: str) -> tuple[str | None, list[int]]:
        """The node id and node-local GPU ids of the job's latest attempt (None before it started)."""
        rows = self._do("SELECT node, gpus FROM ray_jobs WHERE job_id=?", (job_id,))
        if not rows or rows[0][0] is None:
            return None, []
        return rows[0][0], json.loads(rows[0][1] or "[]")


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
        from pkb_mcp.jobs.cluster_node import Lease

        self._lease_class = ray.remote(max_restarts=0, max_concurrency=4)(Lease)

    # ------------------------------------------------------------ admission

    def node_gpus(self) -> list[int]:
        """GPUs of each alive node (logical GPUs count: CI's cluster has them)."""
        ray = _ray()
        return [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]

    def gpus_needed(self, kind: str, world_size: int) -> int:
        largest = max(self.node_gpus(), default=0)
        return max(world_size, largest) if _verb(kind).whole_node else world_size

    def admit(self, kind: str, params: RunRequest) -> None:
        """Refuse at submit what no node can hold: one clear sentence with the fix."""
        world_size = params.world_size
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

    def _start(self, job_id: str, kind: str, params: RunRequest, cancel: threading.Event) -> Any:
        """A new placement group and actor for the job; None when cancelled while waiting for room."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.gpus_needed(kind, params.world_size)
        self._remove_placement(job_id)  # one a lost node left behind would hold its GPUs forever
        group = self._placement(job_id, gpus)
        while not _ray().wait([group.ready()], timeout=PLACEMENT_WAIT_S)[0]:
            if cancel.is_set():  # cancelled, or the server stops: nothing started yet
                self._remove_placement(job_id)
                return None
        path = Path(params.path)
        return self._lease_class.options(
            name=actor_name(job_id),
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=1,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=0
            ),
            runtime_env={"env_vars": self.env},
        ).remote(job_id, kind, params.model_dump(mode="json"), _read_source(path), path.name, self.env)

    def run(
        self,
        job_id: str,
        kind: str,
        params: RunRequest,
        table: RayJobTable,
        cancel: threading.Event,
        stopping: Callable[[], bool],
        progress: Callable[[float, float | None, str], None],
        placed_at: Callable[[], None] = lambda: None,
    ) -> RemoteEnd:
        """Attach to the job's lease (a previous server's) or start one, and follow it to its end;
        `placed_at()` once it holds its node (a deadline counts from there, not from the wait for
        room). Raises NodeLost when the lease, its node actor or its node dies first."""
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
                self._stop_on_node(job_id, table)  # its GPUs are freed next: nothing of it may run on
                self._release(job_id, actor)
                raise NodeLost(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
            if not placed:
                table.placed(job_id, state["node"], state["gpus"])
                placed = True
                placed_at()
            progress(*state["progress"])
            end = state["end"]
            if end is not None:
                table.warmed(job_id, int(state.get("warm") or 0))
                try:  # a profile's artifacts land before the node forgets them
                    return _ended(kind, params, end)
                finally:
                    self._release(job_id, actor)
            time.sleep(POLL_S)

    def node_name(self, node_id: str) -> str:
        """The name of the node's actor that runs this server's jobs there."""
        from pkb_mcp.jobs.cluster_node import node_actor_name

        return node_actor_name(node_id, self.env)

    def _stop_on_node(self, job_id: str, table: RayJobTable) -> None:
        """The job's lease (or its node) is lost: have the node's actor cancel the job and wait for its
        launches to end (the actor also does so by itself once it sees the lease gone). A node not
        known yet: every node's actor of this server is asked."""
        from pkb_mcp.jobs.cluster_node import DROP_WAIT_S, settings_tag

        ray = _ray()
        node, _ = table.where(job_id)
        ours = "-" + settings_tag(self.env)
        names = [self.node_name(node)] if node else [n for n in node_actors() if n.endswith(ours)]
        calls = []
        for name in names:
            with contextlib.suppress(Exception):  # gone with its node: nothing of the job runs there
                calls.append(ray.get_actor(name, namespace=NAMESPACE).drop.remote(job_id))
        with contextlib.suppress(Exception):  # a dead node's actor: its reaper kills the job's launches
            ray.wait(calls, num_returns=len(calls), timeout=DROP_WAIT_S + 10)

    def _release(self, job_id: str, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            _ray().kill(actor, no_restart=True)
        self._remove_placement(job_id)

    def _remove_placement(self, job_id: str) -> None:
        from ray.util.placement_group import get_placement_group, remove_placement_group

        with contextlib.suppress(Exception):  # none of that name: nothing to free
            remove_placement_group(get_placement_group(placement_name(job_id)))


def node_actors() -> list[str]:
    """The names of every node's actor of pkb on the cluster (every server's settings)."""
    from pkb_mcp.jobs.cluster_node import NODE_PREFIX

    return [
        a["name"]
        for a in _ray().util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and a["name"].startswith(NODE_PREFIX)
    ]


def close_nodes(timeout_s: float = 300.0) -> int:
    """Close every node's actor of pkb on the cluster: their jobs are cancelled, their warm sandboxes
    stopped, and the actors end (after an upgrade of pkb, or to free the nodes). Returns how many."""
    ray = _ray()
    calls = []
    for name in node_actors():
        with contextlib.suppress(Exception):  # ended meanwhile
            calls.append(ray.get_actor(name, namespace=NAMESPACE).close.remote())
    if calls:
        ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
    return len(calls)


def _ended(kind: str, params: RunRequest, end: dict[str, Any]) -> RemoteEnd:
    """How the job ended, as the server stores it. A profile's trace and timeline came as bytes with
    the end: they are written under the server's own profiles folder (the job's `profiles_dir`), and
    the result's paths rewritten to point there (pkb_mcp/profiling/profile.py's land_artifacts)."""
    if end.get("state") != "done":
        return RemoteEnd(str(end.get("state")), None, str(end.get("error") or "")[:4000])
    outcome = _validated(kind, end.get("result"))
    if kind == "profile" and outcome.result is not None:
        from pkb_mcp.profiling.profile import land_artifacts

        folder = Path(params.profiles_dir) if params.profiles_dir else None
        outcome.result = land_artifacts(outcome.result, end.get("artifacts"), folder)
    return outcome


def _validated(kind: str, result: Any) -> RemoteEnd:
    """A node's result, re-read through the server's own model of it: anything else is a failure."""
    from pydantic import ValidationError

    model = _verb(kind).result
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


def _scan(owner: int) -> tuple[dict[int, str], set[int]]:
    """The owner's children that lead a session of their own (the process backend's launchers), with
    the launch marker each carries; and the session of every process now alive."""
    found: dict[int, str] = {}
    sessions: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            pid, ppid, session = int(entry.name), int(fields[1]), int(fields[3])
            sessions.add(session)
            if ppid != owner or session != pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            found[pid] = next((v.decode() for v in env if v.startswith(b"PKB_LAUNCH=")), "")
        except (OSError, ValueError, IndexError):
            continue
    return found, sessions


def reap(owner: int, poll_s: float = 0.5) -> None:
    """Wait for the actor process `owner` to end; then kill what its launches left: the process
    backend's sessions (by session and launch marker) and the Docker containers whose owner is gone.
    A session none of whose processes is alive any more is forgotten: a node's actor lives long, and
    its number may then be given to someone else's session."""
    seen: dict[int, str] = {}
    while True:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        launchers, alive = _scan(owner)
        seen = {session: marker for session, marker in {**seen, **launchers}.items() if session in alive}
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
elif __name__ == "__main__" and sys.argv[1:2] == [
    "close-nodes"
]:  # python -m pkb_mcp.jobs.cluster close-nodes ADDRESS
    _ray().init(address=sys.argv[2], namespace=NAMESPACE, log_to_driver=False, logging_level="warning")
    print(f"closed {close_nodes()} node actors")


def _verb(kind: str) -> Verb:
    """The verb of a job's kind (pkb_mcp/service.py's VERBS)."""
    if kind not in VERBS:
        raise UserError(f"unknown job kind {kind!r}")
    return VERBS[kind]
