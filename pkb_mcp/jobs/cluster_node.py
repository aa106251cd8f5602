"""What pkb runs on a node of a Ray cluster (docs/scale-out.md): the node's actor and the job leases.

The node's actor (`pkb-node-<node id>-<settings>`) lives as long as the node is in use: it owns the
node's sandbox backends and their warm pool (sandbox/pool.py), runs each job's service function in a
thread, and keeps each job's progress and end until the job's lease is gone. A job's lease
(`pkb-job-<job>`) is the actor in the job's placement-group bundle: it holds the job's GPUs, hands
the job with their ids to its node's actor, and forwards the server's polls and cancellation.

Imported only on the cluster path, where Ray is installed; a job runs its verb of pkb_mcp/service.py's
VERBS on the node, through the node's own sandbox backends.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_mcp import __version__
from pkb_mcp.errors import Cancelled, UserError
from pkb_mcp.log import get
from pkb_mcp.models import RunRequest
from pkb_mcp.runs.context import JobContext
from pkb_mcp.service import VERBS

log = get(__name__)

NAMESPACE = "pkb"  # the Ray namespace of every actor pkb starts

NODE_PREFIX = "pkb-node-"
WATCH_S = 2.0  # how often the node's actor checks that each job's lease is alive
PING_WAIT_S = 10.0
DROP_WAIT_S = 60.0  # how long dropping a job waits for its launches to end
HAND_OFF_S = 300.0  # how long a lease tries to reach its node's actor (one closing may be in the way)
NODE_CALLS = 64  # concurrent calls of the node's actor: polls, cancels, starts (jobs have threads)
# a Ray worker with no GPU gets CUDA_VISIBLE_DEVICES="" unless told otherwise: the node's actor needs
# to see the node's GPUs (its jobs' sandboxes are given exactly theirs)
KEEP_DEVICES = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def node_idle_s() -> float:
    """An actor with no job for this long closes its pool and exits: its warm sandboxes have
    expired by then (sandbox/base.py's WARM_IDLE_S)."""
    from sandbox import base

    return base.WARM_IDLE_S + 60.0


def settings_tag(env: dict[str, str]) -> str:
    """A digest of the pkb version and a server's settings: the end of its node actors' names."""
    return hashlib.sha256(json.dumps([__version__, sorted(env.items())]).encode()).hexdigest()[:10]


def node_actor_name(node_id: str, env: dict[str, str]) -> str:
    """The name of the node's actor for a server with these settings and this pkb version."""
    return f"{NODE_PREFIX}{node_id}-{settings_tag(env)}"


@dataclass
class _NodeJob:
    """One job in the node's actor, keyed by its lease (one attempt of a scheduler job)."""

    job_id: str
    lease: Any
    cancel: threading.Event = field(default_factory=threading.Event)
    progress: tuple[float, float | None, str] = (0.0, None, "started on a cluster node")
    end: dict[str, Any] | None = None
    warm: int = 0  # its launches that ran in a warm sandbox
    thread: threading.Thread | None = None


class NodeActor:
    """The node's actor: the node's backends, their warm pools, and the jobs its leases handed it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, _NodeJob] = {}  # by lease (actor id)
        self.by_cancel: dict[int, _NodeJob] = {}  # by id of the job's cancel event: counts warm launches
        self.backends: dict[int, Any] = {}
        self.idle_since = time.monotonic()
        self.closing = False
        # outlives this process: if the node's Ray kills it, its sandboxes (warm ones too) are killed
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "pkb_mcp.jobs.cluster", "reap", str(os.getpid())],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        threading.Thread(target=self._watch, name="pkb-node-watch", daemon=True).start()

    # ------------------------------------------------------------ calls from leases and the server

    def start(
        self,
        ticket: str,
        job_id: str,
        kind: str,
        params: dict[str, Any],
        source: str | None,
        source_name: str,
        gpus: list[int],
        lease: Any,
    ) -> bool:
        """Run the job; False when this actor is closing (the lease then waits for a new one)."""
        with self.lock:
            if self.closing:
                return False
            if ticket in self.jobs:
                return True  # a repeated hand-off of the same lease
            job = _NodeJob(job_id, lease)
            self.jobs[ticket] = job
            self.by_cancel[id(job.cancel)] = job
        job.thread = threading.Thread(
            target=self._run,
            args=(job, kind, params, source, source_name, gpus),
            name=f"pkb-job-{job_id}",
            daemon=True,
        )
        job.thread.start()
        log.info("node.job_started", job=job_id, gpus=gpus)
        return True

    def poll(self, ticket: str) -> dict[str, Any] | None:
        job = self.jobs.get(ticket)
        if job is None:
            return None
        return {"progress": job.progress, "end": job.end, "warm": job.warm}

    def cancel(self, ticket: str) -> None:
        job = self.jobs.get(ticket)
        if job is not None:
            job.cancel.set()

    def drop(self, job_id: str, wait_s: float = DROP_WAIT_S) -> int:
        """Cancel every attempt of the job here and wait (at most `wait_s`) for its launches to end;
        the server calls this before it frees the GPUs of a job whose lease died. Returns how many
        attempts were still running at the end of the wait."""
        with self.lock:
            found = [(t, j) for t, j in self.jobs.items() if j.job_id == job_id]
        for _, job in found:
            job.cancel.set()
        give_up = time.monotonic() + wait_s
        for _, job in found:
            if job.thread is not None:
                job.thread.join(max(0.0, give_up - time.monotonic()))
        running = sum(1 for _, j in found if j.thread is not None and j.thread.is_alive())
        with self.lock:
            for ticket, job in found:
                if job.thread is None or not job.thread.is_alive():
                    self._forget(ticket)
        return running

    def close(self) -> None:
        """Cancel every job, close the warm pools (their sandboxes stop), then end this actor."""
        with self.lock:
            self.closing = True
        self._shut_down()

    def ping(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------ the jobs

    def _backend(self, sandbox: str) -> Any:
        """The backend the job names, with its warm pool, made once per process; None when it cannot
        run here (the service says so to the job)."""
        from pkb_mcp.launches import enable_warm_pool
        from sandbox import SandboxUnavailable, select_backend

        try:
            backend: Any = select_backend(sandbox)
        except SandboxUnavailable:
            return None
        with self.lock:  # once per backend, before any job of this actor uses it
            if id(backend) in self.backends:
                return backend
            enable_warm_pool(backend, batch=True)  # a node's jobs are a batch's, back to back
            run_sandbox = backend.run

            def counted(launch: Any, cancel: threading.Event | None = None) -> Any:
                run = run_sandbox(launch, cancel)
                owner = self.by_cancel.get(id(cancel)) if cancel is not None else None
                if owner is not None and run.warm:
                    with self.lock:
                        owner.warm += 1
                return run

            backend.run = counted  # the backend's own report of each launch, counted for its job
            self.backends[id(backend)] = backend
        return backend

    def _quiet_others(self, own: Any) -> contextlib.ExitStack:
        """No sandbox of another backend's pool starts or warms up while a benchmark holds the node
        (its own pool is quieted by the benchmark itself, after it started its sandboxes)."""
        from pkb_mcp.launches import warm_pool

        stack = contextlib.ExitStack()
        with self.lock:
            others = [b for b in self.backends.values() if b is not own]
        for backend in others:
            pool = warm_pool(backend)
            if pool is not None:
                stack.enter_context(pool.quiet())
        return stack

    def _run(
        self,
        job: _NodeJob,
        kind: str,
        params: dict[str, Any],
        source: str | None,
        source_name: str,
        gpus: list[int],
    ) -> None:

        folder = Path(tempfile.mkdtemp(prefix="pkb-ray-job-"))  # the source, a profile's artifacts
        try:
            path = folder / Path(source_name).name
            if source is not None:
                path.write_text(source, encoding="utf-8")
            else:
                path = folder / "missing" / Path(source_name).name

            def progress(done: float, total: float | None, message: str) -> None:
                job.progress = (done, total, message)

            try:
                given = RunRequest.model_validate(params)
                held = gpus[: given.world_size] if given.device == "cuda" else None
                # a profile writes its artifacts here, never into the server's folder it names
                profiles = {"profiles_dir": str(folder / "profiles")} if kind == "profile" else {}
                here = given.model_copy(update={"path": str(path), "gpus": held, **profiles})
                backend = self._backend(here.sandbox)
                verb = VERBS[kind]
                with self._quiet_others(backend) if verb.whole_node else contextlib.ExitStack():
                    result = verb.run(here, JobContext(progress, job.cancel))
                end: dict[str, Any] = {"state": "done", "result": result.model_dump(mode="json")}
                if kind == "profile":  # the bytes travel with the end; kept until the server fetched it
                    from pkb_mcp.profiling.profile import pack_artifacts

                    end["artifacts"] = pack_artifacts(end["result"], folder)
                job.end = end
            except Cancelled as exc:
                job.end = {"state": "cancelled", "error": str(exc)}
            except UserError as exc:
                job.end = {"state": "failed", "error": str(exc)}
            except Exception as exc:  # a bug of ours on the node: say so, keep the actor answering
                why = f"internal error on a cluster node: {type(exc).__name__}: {exc}"
                job.end = {"state": "failed", "error": why}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self.idle_since = time.monotonic()
            log.info("node.job_ended", job=job.job_id, state=(job.end or {}).get("state"), warm=job.warm)

    def _forget(self, ticket: str) -> None:
        """Under the lock: the job's lease has what it needs, or is gone."""
        job = self.jobs.pop(ticket, None)
        if job is not None:
            self.by_cancel.pop(id(job.cancel), None)
            self.idle_since = time.monotonic()

    # ------------------------------------------------------------ the leases, idleness

    def _watch(self) -> None:
        import ray
        from ray.exceptions import ActorDiedError

        while not self.closing:
            time.sleep(WATCH_S)
            with self.lock:
                jobs = list(self.jobs.items())
                if not jobs and time.monotonic() - self.idle_since > node_idle_s():
                    self.closing = True
            if self.closing:
                log.info("node.idle_exit")
                self._shut_down()
                return
            if not jobs:
                continue
            pings = {job.lease.ping.remote(): (ticket, job) for ticket, job in jobs}
            ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=PING_WAIT_S)
            for ref in ready:
                ticket, job = pings[ref]
                try:
                    ray.get(ref)
                except ActorDiedError:  # its lease is gone: nobody will fetch this job's end
                    if not job.cancel.is_set():
                        log.warning("node.lease_lost", job=job.job_id)
                    job.cancel.set()
                    if job.thread is None or not job.thread.is_alive():
                        with self.lock:
                            self._forget(ticket)
                except Exception:  # unreachable for now (a slow worker): ask again next round
                    continue

    def _shut_down(self) -> None:
        """Cancel the jobs, stop the warm sandboxes, and end this actor's process."""
        from pkb_mcp.launches import warm_pool

        with self.lock:
            jobs = list(self.jobs.values())
            backends = list(self.backends.values())
        for job in jobs:
            job.cancel.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(DROP_WAIT_S)
        for backend in backends:
            pool = warm_pool(backend)
            if pool is not None:
                pool.close()
        threading.Thread(target=_exit_soon, daemon=True).start()


def _exit_soon() -> None:
    """End this actor a moment after its last call returned (its name is freed once it is dead)."""
    import ray

    time.sleep(0.5)
    with contextlib.suppress(Exception):
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)  # an end Ray expects
        time.sleep(30.0)
    os._exit(0)


@functools.cache
def _node_class() -> Any:
    import ray

    return ray.remote(NodeActor)


def node_actor(node_id: str, env: dict[str, str]) -> Any:
    """The node's actor for these settings, started (on that node) if it has none yet."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return (
        _node_class()
        .options(
            name=node_actor_name(node_id, env),
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=NODE_CALLS,
            num_cpus=0,
            num_gpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            runtime_env={"env_vars": {**env, **KEEP_DEVICES}},
        )
        .remote()
    )


class Lease:
    """The job's actor in its placement-group bundle: holds the job's GPUs, hands the job (with
    those GPU ids) to its node's actor, and forwards the server's polls and cancellation."""

    def __init__(
        self,
        job_id: str,
        kind: str,
        params: dict[str, Any],
        source: str | None,
        source_name: str,
        env: dict[str, str],
    ) -> None:
        import ray

        context = ray.get_runtime_context()
        self.job_id = job_id
        self.node = context.get_node_id()
        self.ticket = context.get_actor_id() or job_id
        self.gpus = [int(g) for g in ray.get_gpu_ids()]
        self.cancelled = threading.Event()
        self.handed: Any = None  # the node's actor, once it runs the job
        self.end: dict[str, Any] | None = None  # how the job ended before it reached the node's actor
        args = (kind, params, source, source_name, env, context.current_actor)
        threading.Thread(target=self._hand_off, args=args, name="pkb-lease", daemon=True).start()

    def _hand_off(
        self, kind: str, params: dict[str, Any], source: str | None, source_name: str, env: dict, me: Any
    ) -> None:
        import ray

        give_up = time.monotonic() + HAND_OFF_S
        why = ""
        while time.monotonic() < give_up:
            if self.cancelled.is_set():
                self.end = {"state": "cancelled", "error": "cancelled before it started on the node"}
                return
            try:
                node = node_actor(self.node, env)
                args = (self.ticket, self.job_id, kind, params, source, source_name, self.gpus, me)
                if ray.get(node.start.remote(*args), timeout=120):
                    self.handed = node
                    if self.cancelled.is_set():
                        node.cancel.remote(self.ticket)
                    return
                why = "the node's pkb actor was closing"
            except Exception as exc:  # the actor died or is still starting: try again
                why = f"{type(exc).__name__}: {str(exc)[:300]}"
            time.sleep(1.0)
        self.end = {
            "state": "failed",
            "error": f"pkb's actor on the cluster node could not be reached: {why}",
        }

    def poll(self) -> dict[str, Any]:
        """The job's progress and end as the node's actor has them; raises when that actor died, or
        no longer has the job (the server counts either as a lost node)."""
        import ray

        where = {"node": self.node, "gpus": self.gpus}
        if self.handed is None:
            return {
                "progress": (0.0, None, "starting on a cluster node"),
                "end": self.end,
                "warm": 0,
                **where,
            }
        state = ray.get(self.handed.poll.remote(self.ticket), timeout=30)
        if state is None:
            raise RuntimeError("the node's pkb actor no longer has the job")
        return {**state, **where}

    def cancel(self) -> None:
        self.cancelled.set()
        if self.handed is not None:
            self.handed.cancel.remote(self.ticket)

    def ping(self) -> str:
        return self.ticket
