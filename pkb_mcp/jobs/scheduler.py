"""Long work as jobs: a queue in front of the node's GPUs, progress, deadlines and cancellation.

A job is a *kind* (compile, check, bench, profile) with its `RunRequest`, run by that verb of
`service.VERBS` in a worker thread once its resources are free: the GPUs it needs (world size, for cuda
jobs), or the one CPU slot (CPU jobs use every core), or a compile slot. Jobs start in submission
order as their resources allow (one submitted `first` goes ahead of the queued ones). Everything about
a job is written to the store, so a restarted scheduler re-queues jobs that were queued or running and
still answers for finished ones.

A GPU job whose solution builds load_inline extensions is built first, while it waits, in a pool of
`config.build_slots()` builds beside the GPU queue (no GPU held: builds use the CPU cores the GPU jobs
leave idle), and takes its GPUs once its build has ended, finding its extensions in the node's cache;
a job waiting for its build holds no place in the GPU queue. On a CPU device a build would take the
CPU jobs' own cores, so there the job builds as it runs; on a Ray cluster the nodes build. A job may
give its GPUs back before it ends (pkb_mcp/runs/context.py): a benchmark does once its launches are
done, and the next job runs while it judges the timed outputs.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ValidationError

from pkb_mcp import config, service
from pkb_mcp.errors import Cancelled, UserError
from pkb_mcp.jobs.store import JobRecord, JobStore
from pkb_mcp.log import get
from pkb_mcp.models import Kind, RunRequest
from pkb_mcp.runs.context import JobContext
from pkb_mcp.runs.run import BUILD_TIMEOUT_S
from pkb_mcp.service import VERBS, Verb

if TYPE_CHECKING:
    from pkb_mcp.jobs.cluster import RayCluster

log = get(__name__)


# A backstop above the service's own per-launch deadlines (a bench runs two launches).
DEADLINE_FACTOR = 2.5
DEADLINE_SLACK_S = 60.0


def _deadline_s(request: RunRequest) -> float:
    """A job's overall deadline, from its start: its launches' limits, and the limit of the extension
    builds it may still run inside itself (on CPU, or a GPU job whose build ahead did not finish):
    a cold C++ build on 2 CPU cores takes minutes, longer than a check's launches are given."""
    deadline = DEADLINE_FACTOR * request.timeout_s + DEADLINE_SLACK_S
    try:
        text = Path(request.path).read_text(encoding="utf-8", errors="replace") if request.path else ""
    except OSError:
        text = ""
    return deadline + (BUILD_TIMEOUT_S if text and service.needs_build(text) else 0.0)


def job_request(record: JobRecord) -> RunRequest:
    """A stored job's parameters, read back through the model (a store of another version may hold
    others: the job then fails saying so)."""
    try:
        return RunRequest.model_validate(record.params)
    except ValidationError as exc:
        raise UserError(f"job {record.id} has parameters this version cannot run: {exc}") from exc


class Need(NamedTuple):
    """What a job holds while it runs: `units` of one resource (GPUs, the CPU slot, a compile slot;
    "ray": nothing here, the cluster's placement groups wait for room)."""

    resource: Literal["gpu", "cpu", "compile", "ray"]
    units: int


@dataclass
class _Live:
    """What only the running server knows of a job: its cancel event and its result object."""

    cancel: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    result: BaseModel | None = None
    then: Callable[[str], None] | None = None  # called at its end, before its resources are given back


class Scheduler:
    def __init__(
        self,
        store: JobStore,
        gpus: int,
        compile_slots: int = 2,
        cluster: RayCluster | None = None,
        verbs: Mapping[str, Verb] = VERBS,
    ):
        self.store = store
        self.verbs = verbs  # the kinds of job it runs (tests give theirs)
        # with a Ray cluster, check and bench jobs run on its nodes (pkb_mcp/jobs/cluster.py); compiles stay
        self.cluster = cluster
        self.ray_table = None
        if cluster is not None:
            from pkb_mcp.jobs.cluster import RayJobTable

            self.ray_table = RayJobTable(store.path)
        self.gpu_count = gpus
        self.free_gpus = list(range(gpus))
        self.cpu_free = True
        self.compile_free = compile_slots
        self._builds: concurrent.futures.ThreadPoolExecutor | None = None  # started with the first build
        self._building: dict[str, concurrent.futures.Future[None]] = {}  # job -> its extensions' build
        self._live: dict[str, _Live] = {}
        self._queue: list[str] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._threads: set[threading.Thread] = set()  # the jobs' threads (stop waits for them)
        for record in store.unfinished():
            store.requeue(record.id)
            self._enqueue(record.id)
            log.info("job.requeued", job=record.id, kind=record.kind)
        self._dispatcher = threading.Thread(target=self._dispatch, name="pkb-scheduler", daemon=True)
        self._dispatcher.start()

    # ------------------------------------------------------------ public

    def submit(
        self, kind: Kind, request: RunRequest, first: bool = False, then: Callable[[str], None] | None = None
    ) -> str:
        """Queue a job; `first` puts it ahead of every queued job (a batch's benchmarks, so that an
        interrupted batch has speedups for the files it checked). `then(job_id)` runs in the job's
        thread once it has ended (in whatever state; not when it is re-queued), before its GPUs go to
        the next job: a job submitted there `first` runs next (a batch's benchmark after its check)."""
        if kind not in self.verbs:
            raise UserError(f"unknown job kind {kind!r}")
        if self.cluster is not None and self.verbs[kind].remote:
            self.cluster.admit(kind, request)
        job_id = uuid.uuid4().hex[:12]
        if then is not None:
            with self._cond:
                self._live[job_id] = _Live(then=then)
        self.store.create(job_id, kind, request.model_dump(mode="json"))
        self._enqueue(job_id, first)
        log.info("job.submitted", job=job_id, kind=kind)
        return job_id

    def get(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise UserError(f"job {job_id} does not exist; job ids come from wait=false calls")
        return record

    def result(self, job_id: str) -> dict[str, Any] | None:
        return self.store.result(job_id)

    def cancel(self, job_id: str, reason: str = "cancelled by the client") -> JobRecord:
        record = self.get(job_id)
        if record.terminal:
            return record
        with self._cond:
            live = self._live.setdefault(job_id, _Live())
            live.reason = reason
            live.cancel.set()
            if job_id in self._queue:
                self._queue.remove(job_id)
                self._building.pop(job_id, None)  # its build ends on the cancel event
                self.store.finish(job_id, "cancelled", error=reason)
            self._cond.notify_all()
        return self.get(job_id)

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop dispatching and kill running jobs; they stay unfinished (queued again, never given a
        verdict), so the next start re-runs them. Waits up to `wait_s` for the jobs' threads to end
        (each kills its launch on its cancel event)."""
        with self._cond:
            self._stopped = True
            for live in self._live.values():
                live.cancel.set()
            self._cond.notify_all()
            running = list(self._threads)
        if self._builds is not None:
            self._builds.shutdown(wait=False, cancel_futures=True)
        give_up = time.monotonic() + wait_s
        for thread in running:
            thread.join(max(0.0, give_up - time.monotonic()))

    # ------------------------------------------------------------ internals

    def _enqueue(self, job_id: str, first: bool = False) -> None:
        with self._cond:
            live = self._live.setdefault(job_id, _Live())
            if first:
                self._queue.insert(0, job_id)
            else:
                self._queue.append(job_id)
            self._start_build(job_id, live)
            self._cond.notify_all()

    def _start_build(self, job_id: str, live: _Live) -> None:
        """Build a queued GPU job's extensions in the build pool, where it has any (under the lock)."""
        record = self.store.get(job_id)
        if record is None or self.cluster is not None or job_id in self._building:
            return
        verb = self.verbs.get(record.kind)
        try:
            request = job_request(record)
            text = request.path and Path(request.path).read_text(encoding="utf-8", errors="replace")
        except (UserError, OSError):
            return  # the job fails as it runs, saying why
        if verb is None or not verb.gpus or (request.device or service.default_device()) != "cuda":
            return
        if not text or not service.needs_build(text):  # a benchmark after its check: built already
            return
        if self._builds is None:
            self._builds = concurrent.futures.ThreadPoolExecutor(config.build_slots(), "pkb-build")
        self._building[job_id] = self._builds.submit(self._build, job_id, request, live.cancel)

    def _build(self, job_id: str, request: RunRequest, cancel: threading.Event) -> None:
        self.store.progress(job_id, 0, None, "building the solution's extensions (no GPU held yet)")
        try:
            service.prebuild(request, JobContext(cancel=cancel))
        except Exception as exc:  # whatever failed, the job's own run meets it again and reports it
            log.info("job.prebuild_failed", job=job_id, error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._cond:
                self._cond.notify_all()

    def _needs(self, record: JobRecord) -> Need:
        """What a job must hold to run. A benchmark or a profile takes every GPU of the node, so that
        nothing else shares its NVLink, HBM or power budget while it is timed."""
        verb = self.verbs.get(record.kind)
        if verb is not None and not verb.gpus:
            return Need("compile", 1)
        if self.cluster is not None:
            return Need("ray", 0)  # the cluster's placement groups wait for room, not this queue
        try:
            request = job_request(record)
        except UserError:
            return Need("cpu", 1)  # it fails as soon as it runs, saying why
        if (request.device or service.default_device()) != "cuda":
            return Need("cpu", 1)
        world_size = request.world_size
        whole_node = verb is not None and verb.whole_node
        return Need("gpu", max(world_size, self.gpu_count) if whole_node else world_size)

    def _take(self, need: Need) -> list[int] | None:
        kind, count = need.resource, need.units
        if kind == "gpu" and len(self.free_gpus) >= count:
            taken, self.free_gpus = self.free_gpus[:count], self.free_gpus[count:]
            return taken
        if kind == "cpu" and self.cpu_free:
            self.cpu_free = False
            return []
        if kind == "compile" and self.compile_free > 0:
            self.compile_free -= 1
            return []
        if kind == "ray":
            return []
        return None

    def _give(self, need: Need, taken: list[int]) -> None:
        with self._cond:
            if need.resource == "gpu":
                self.free_gpus = sorted(self.free_gpus + taken)
            elif need.resource == "cpu":
                self.cpu_free = True
            elif need.resource == "compile":
                self.compile_free += 1
            self._cond.notify_all()

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                started = False
                blocked: set[str] = set()
                for job_id in list(self._queue):
                    record = self.store.get(job_id)
                    if record is None:
                        self._queue.remove(job_id)
                        continue
                    build = self._building.get(job_id)
                    if build is not None and not build.done():
                        continue  # no place held in its class while it builds
                    self._building.pop(job_id, None)
                    need = self._needs(record)
                    if need.resource == "gpu" and need.units > self.gpu_count:
                        self._queue.remove(job_id)
                        self.store.finish(
                            job_id,
                            "failed",
                            error=f"the job needs {need.units} GPUs and this server "
                            f"has {self.gpu_count}; ask for a smaller world size",
                        )
                        continue
                    # first come, first served within a resource class: a later job never overtakes a
                    # waiting one, so a large job cannot be starved by a stream of small ones
                    if need.resource in blocked:
                        continue
                    taken = self._take(need)
                    if taken is None:
                        blocked.add(need.resource)
                        continue
                    self._queue.remove(job_id)
                    self.store.started(job_id)  # here, not in the thread: `started` orders dispatches
                    thread = threading.Thread(
                        target=self._run_remote if need.resource == "ray" else self._run,
                        args=(record, need, taken),
                        name=f"pkb-job-{job_id}",
                        daemon=True,
                    )
                    self._threads = {t for t in self._threads if t.is_alive()} | {thread}
                    thread.start()
                    started = True
                if not started:
                    self._cond.wait(timeout=1.0)

    def _run(self, record: JobRecord, need: Need, taken: list[int]) -> None:
        live = self._live[record.id]
        last = [0.0]

        def progress(done: float, total: float | None, message: str) -> None:
            now = time.monotonic()
            if now - last[0] > 0.2 or (total is not None and done >= total):
                last[0] = now
                self.store.progress(record.id, done, total, message)

        watchdog = None
        given = False

        def give_back() -> None:  # once: a benchmark gives back before its end, every job at its end
            nonlocal given
            with self._cond:
                if not given:
                    given = True
                    self._give(need, taken)

        try:
            request = job_request(record)
            if taken:
                request = request.model_copy(update={"gpus": taken[: request.world_size]})
            deadline_s = _deadline_s(request)
            watchdog = threading.Timer(deadline_s, self._expire, args=(record.id, deadline_s))
            watchdog.daemon = True
            watchdog.start()
            if record.kind not in self.verbs:
                raise UserError(f"job {record.id} is of a kind this version does not run: {record.kind!r}")
            # a benchmark gives its GPUs back before judging
            result = self.verbs[record.kind].run(request, JobContext(progress, live.cancel, give_back))
            live.result = result
            self.store.finish(record.id, "done", result=result.model_dump(mode="json"))
        except Cancelled as exc:
            if self._stopped and not live.reason:
                self.store.requeue(record.id)  # the server is stopping: the next one runs it again
            else:
                self.store.finish(record.id, "cancelled", error=f"{live.reason or 'cancelled'}: {exc}")
        except UserError as exc:
            self.store.finish(record.id, "failed", error=str(exc))
        except Exception as exc:  # a bug of ours: keep the server alive, say what happened
            log.exception("job.crashed", job=record.id)
            self.store.finish(record.id, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self._then(record.id, live)
            give_back()
            log.info("job.finished", job=record.id, state=self.get(record.id).state)

    def _then(self, job_id: str, live: _Live) -> None:
        """The job's `then`, where it has ended; a failure of it is logged, never the job's."""
        if live.then is None or not self.get(job_id).terminal:
            return
        try:
            live.then(job_id)
        except Exception:
            log.exception("job.then_failed", job=job_id)

    def _run_remote(self, record: JobRecord, need: Need, taken: list[int]) -> None:
        """A job on the Ray cluster: attach to its actor or start one, follow it, store how it ended."""
        from pkb_mcp.jobs.cluster import MAX_NODE_LOSSES, NodeLost

        assert self.cluster is not None and self.ray_table is not None
        live = self._live[record.id]

        def progress(done: float, total: float | None, message: str) -> None:
            self.store.progress(record.id, done, total, message)

        watchdogs: list[threading.Timer] = []

        def placed(deadline_s: float) -> None:
            # from when the job holds its node: on a busy cluster the wait for room can be long
            watchdogs.append(threading.Timer(deadline_s, self._expire, args=(record.id, deadline_s)))
            watchdogs[0].daemon = True
            watchdogs[0].start()

        requeue = False
        try:
            request = job_request(record)
            end = self.cluster.run(
                record.id,
                record.kind,
                request,
                self.ray_table,
                live.cancel,
                lambda: self._stopped and not live.reason,
                progress,
                lambda: placed(DEADLINE_FACTOR * request.timeout_s + DEADLINE_SLACK_S),
            )
            if end.state == "detached":
                self.store.requeue(record.id)  # it runs on; the next server collects it
            elif end.state == "done":
                self.store.finish(record.id, "done", result=end.result)
            elif end.state == "cancelled":
                self.store.finish(record.id, "cancelled", error=f"{live.reason or 'cancelled'}: {end.error}")
            else:
                self.store.finish(record.id, "failed", error=end.error)
        except NodeLost as exc:
            losses = self.ray_table.lost(record.id)
            log.warning("job.node_lost", job=record.id, losses=losses, why=str(exc))
            if live.cancel.is_set():
                why = f"{live.reason or 'cancelled'}; its node was lost meanwhile"
                self.store.finish(record.id, "cancelled", error=why)
            elif losses < MAX_NODE_LOSSES:
                self.store.requeue(record.id)
                self.store.progress(record.id, 0, None, "re-queued: the cluster node running it was lost")
                requeue = True
            else:
                self.store.finish(
                    record.id,
                    "failed",
                    error=f"the cluster node running the job was lost {losses} times ({exc}); "
                    "the job was not re-run again: check the cluster's nodes and submit it again",
                )
        except UserError as exc:
            self.store.finish(record.id, "failed", error=str(exc))
        except Exception as exc:  # a bug of ours or of the cluster's client: say what happened
            log.exception("job.crashed", job=record.id)
            self.store.finish(record.id, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            for watchdog in watchdogs:
                watchdog.cancel()
            self._then(record.id, live)
            if requeue and not self._stopped:
                self._enqueue(record.id)
            log.info("job.finished", job=record.id, state=self.get(record.id).state)

    def _expire(self, job_id: str, deadline_s: float) -> None:
        self.cancel(job_id, reason=f"the job exceeded its overall deadline of {deadline_s:.0f} s")
