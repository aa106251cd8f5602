"""The scheduler's queueing on one node, with stand-in jobs (no harness): disjoint GPU sets run at
once, benchmarks get the node to themselves, nothing overtakes a waiting job of its class, many
concurrent clients lose nothing, cancellation of a queued job, and recovery after a restart."""

import dataclasses
import threading
import time

import pytest

from pkb_mcp import service
from pkb_mcp.errors import Cancelled
from pkb_mcp.jobs import scheduler as sched
from pkb_mcp.jobs.cluster import NodeLost, RemoteEnd
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.models import RunRequest

LOG: list[tuple[str, str, float, list[int]]] = []
LOCK = threading.Lock()
SECONDS: dict[str, float] = {}  # how long each stand-in job (by its problem name) runs


def fake(params, job):
    name, cancel = params.problem, job.cancel
    with LOCK:
        LOG.append(("start", name, time.monotonic(), params.gpus or []))
    deadline = time.monotonic() + SECONDS[name]
    while time.monotonic() < deadline and not cancel.is_set():
        time.sleep(0.01)
    with LOCK:
        LOG.append(("end", name, time.monotonic(), params.gpus or []))
    if cancel.is_set():  # as the service does: a cancelled job raises, it never returns a result
        raise Cancelled("cancelled")
    from pkb_mcp.models import Traffic

    return Traffic(nvlink_bytes=0, hbm_bytes=0, flops=0, rounds=0)


def verbs(**runs):
    """The service's verbs with stand-ins for their functions: `fake` for check and bench unless given."""
    runs = {"check": fake, "bench": fake, **runs}
    return {
        kind: dataclasses.replace(verb, run=runs.get(kind, verb.run)) for kind, verb in service.VERBS.items()
    }


@pytest.fixture
def node(tmp_path):
    LOG.clear()
    made = []

    def make(gpus=4, table=None):
        s = sched.Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=gpus, verbs=table or verbs())
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def submit(s, name, world_size=2, seconds=0.3, kind="check", first=False):
    SECONDS[name] = seconds
    params = RunRequest(path="stand-in.py", problem=name, world_size=world_size, device="cuda", timeout_s=30)
    return s.submit(kind, params, first=first)


def wait_all(s, ids, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.get(i).terminal for i in ids):
            return
        time.sleep(0.02)
    raise AssertionError("jobs did not finish")


def span(name):
    start = next(t for e, n, t, _ in LOG if e == "start" and n == name)
    end = next(t for e, n, t, _ in LOG if e == "end" and n == name)
    return start, end


def test_disjoint_gpu_sets_run_at_once(node):
    s = node()
    ids = [submit(s, "a"), submit(s, "b"), submit(s, "c")]
    wait_all(s, ids)
    (a0, a1), (b0, b1), (c0, _) = span("a"), span("b"), span("c")
    assert a0 < b1 and b0 < a1, "two 2-GPU checks overlap on a 4-GPU node"
    assert c0 >= min(a1, b1) - 0.01, "a third waits for GPUs"
    gpus = {n: g for e, n, _, g in LOG if e == "start"}
    assert set(gpus["a"]).isdisjoint(gpus["b"])


def test_a_benchmark_has_the_node_to_itself(node):
    s = node()
    ids = [submit(s, "check1"), submit(s, "bench", kind="bench"), submit(s, "check2")]
    wait_all(s, ids)
    b0, b1 = span("bench")
    for other in ("check1", "check2"):
        o0, o1 = span(other)
        assert o1 <= b0 + 0.01 or o0 >= b1 - 0.01, f"{other} overlapped the benchmark"
    assert next(g for e, n, _, g in LOG if e == "start" and n == "bench") == [0, 1], (
        "it runs on world_size GPUs"
    )


def test_a_benchmark_that_gives_its_gpus_back_lets_the_next_job_run_while_it_judges(node):
    """Its launches done, a benchmark judges on the host (pkb_mcp/runs/context.py): the next job takes
    the GPUs then, not at the benchmark's end; given back twice, or again at its end, they are one set."""

    def judging(params, job):
        fake(params, job)  # "launches"
        job.release_gpus()
        job.release_gpus()
        time.sleep(0.5)  # judging
        with LOCK:
            LOG.append(("judged", params.problem, time.monotonic(), []))
        return fake(params.model_copy(update={"problem": "nothing"}), job)

    SECONDS["nothing"] = 0.0
    s = node(table=verbs(bench=judging))
    ids = [submit(s, "bench", kind="bench", seconds=0.1), submit(s, "check", seconds=0.1)]
    wait_all(s, ids)
    judged = next(t for e, n, t, _ in LOG if e == "judged")
    assert span("bench")[1] <= span("check")[0] < judged, "the check ran while the benchmark judged"
    assert s.free_gpus == [0, 1, 2, 3]
    ids = [submit(s, f"after{i}", world_size=4) for i in range(2)]
    wait_all(s, ids)
    (_, a1), (b0, _) = span("after0"), span("after1")
    assert b0 >= a1 - 0.01, "the GPUs were not given to two jobs at once"


def test_no_overtaking_so_large_jobs_are_not_starved(node):
    s = node()
    first = submit(s, "running", world_size=2, seconds=0.5)
    time.sleep(0.1)
    big = submit(s, "big", world_size=4, seconds=0.1)
    small = submit(s, "small", world_size=2, seconds=0.1)  # 2 GPUs are free, but it came after "big"
    wait_all(s, [first, big, small])
    assert span("big")[0] <= span("small")[0]


def test_a_job_submitted_first_goes_ahead_of_the_queued_ones(node):
    """A batch's benchmark of a file that passed starts before the checks queued before it."""
    s = node()
    running = submit(s, "running", world_size=4, seconds=0.4)
    time.sleep(0.1)
    queued = [submit(s, f"check{i}", world_size=4, seconds=0.05) for i in range(3)]
    bench = submit(s, "bench", kind="bench", seconds=0.05, first=True)
    wait_all(s, [running, *queued, bench])
    starts = [n for e, n, _, _ in LOG if e == "start"]
    assert starts == ["running", "bench", "check0", "check1", "check2"]


def test_a_jobs_then_runs_before_its_gpus_go_to_the_next_job(node):
    """What a job's `then` submits first runs before the jobs queued behind it: a batch's benchmark
    follows its own check, though the next file's check was queued long before. A `then` that fails
    is logged and changes nothing of the job."""
    s = node()
    ended: list[str] = []

    def bench_next(job_id):
        ended.append(s.get(job_id).state)
        submit(s, "bench0", world_size=4, seconds=0.05, kind="bench", first=True)

    SECONDS["check0"] = 0.3
    params = RunRequest(path="stand-in.py", problem="check0", world_size=4, device="cuda", timeout_s=30)
    check0 = s.submit("check", params, then=bench_next)
    time.sleep(0.1)
    check1 = submit(s, "check1", world_size=4, seconds=0.05)
    SECONDS["broken"] = 0.05
    params = params.model_copy(update={"problem": "broken"})
    broken = s.submit("check", params, then=lambda job_id: 1 / 0)
    wait_all(s, [check0, check1, broken])
    deadline = time.monotonic() + 30
    while len([e for e in LOG if e[0] == "end"]) < 4 and time.monotonic() < deadline:  # bench0 too
        time.sleep(0.02)
    starts = [n for e, n, _, _ in LOG if e == "start"]
    assert starts == ["check0", "bench0", "check1", "broken"]
    assert ended == ["done"], "it runs once the job has ended"
    assert s.get(broken).state == "done"


def test_forty_jobs_from_eight_clients_none_lost_none_starved(node):
    s = node()
    ids: dict[int, list[str]] = {c: [] for c in range(8)}

    def client(c):
        for j in range(5):
            ids[c].append(submit(s, f"c{c}j{j}", world_size=1 + (c + j) % 2, seconds=0.02))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for c in ids.values() for i in c]
    wait_all(s, every)
    elapsed = time.monotonic() - t0
    assert len(every) == 40 and all(s.get(i).state == "done" for i in every)
    for c in range(8):  # each client's jobs are dispatched (and start) in the order it submitted them
        started = [s.get(i).started for i in ids[c]]
        assert started == sorted(started)
    print(f"throughput: {40 / elapsed:.1f} jobs/s of 20 ms each on 4 GPU slots")


def test_cancel_a_queued_job_and_refuse_an_impossible_one(node):
    s = node(gpus=2)
    running = submit(s, "long", world_size=2, seconds=1.0)
    queued = submit(s, "never", world_size=2)
    too_big = submit(s, "huge", world_size=4)
    assert s.cancel(queued).state == "cancelled"
    wait_all(s, [running, too_big])
    assert "needs 4 GPUs and this server has 2" in s.get(too_big).error
    assert all(n != "never" for _, n, _, _ in LOG)


def test_jobs_survive_a_restart(node, tmp_path):
    s = node()
    blocker = submit(s, "blocker", world_size=4, seconds=0.5)
    waiting = submit(s, "waiting", world_size=4, seconds=0.05)
    time.sleep(0.1)
    s.stop()
    time.sleep(0.2)
    s2 = node()  # the same database: the killed running job and the queued one run again
    wait_all(s2, [blocker, waiting])
    assert s2.get(blocker).state == "done" and s2.get(waiting).state == "done"
    assert [n for e, n, _, _ in LOG if e == "start"].count("blocker") == 2


def test_a_job_s_request_reaches_its_verb_whole(tmp_path):
    """A job's RunRequest reaches its verb whole, launches included (a stored record without them runs
    with one launch a side), with the job's cancel event."""
    seen: list[tuple[RunRequest, threading.Event]] = []

    def record(request, job):
        from pkb_mcp.models import Traffic

        seen.append((request, job.cancel))
        return Traffic(nvlink_bytes=0, hbm_bytes=0, flops=0, rounds=0)

    stored = {"problem": "1", "path": "/x.py", "world_size": 2, "device": "cpu", "timeout_s": 60.0}
    store = JobStore(tmp_path / "jobs.sqlite")
    store.create("old", "bench", stored)
    s = sched.Scheduler(store, gpus=0, verbs=verbs(bench=record))
    try:
        new = s.submit("bench", RunRequest(**stored, launches=3))
        wait_all(s, ["old", new])
    finally:
        s.stop()
    assert sorted(r.launches for r, _ in seen) == [1, 3]
    assert all(r.world_size == 2 and r.path == "/x.py" and isinstance(c, threading.Event) for r, c in seen)


# ---------------------------------------------------------------- on a cluster (pkb_mcp/jobs/cluster.py)


class _LosingCluster:
    """A stand-in cluster whose node is lost under every job."""

    def __init__(self) -> None:
        self.runs = 0

    def admit(self, kind: str, params: RunRequest) -> None:
        pass

    def run(self, job_id, kind, params, table, cancel, stopping, progress, placed_at) -> RemoteEnd:
        self.runs += 1
        table.started(job_id)
        raise NodeLost("ActorDiedError: the node died")


def test_a_job_whose_node_is_lost_twice_is_reported_not_dropped(tmp_path):
    cluster = _LosingCluster()
    s = sched.Scheduler(JobStore(tmp_path / "jobs.sqlite"), 0, cluster=cluster)  # type: ignore[arg-type]
    try:
        job = s.submit("check", RunRequest(path="x.py", world_size=2, device="cpu", timeout_s=30))
        deadline = time.monotonic() + 30
        while not s.get(job).terminal and time.monotonic() < deadline:
            time.sleep(0.05)
        record = s.get(job)
        assert record.state == "failed" and "lost 2 times" in (record.error or ""), record
        assert cluster.runs == 2, "re-queued once, then reported"
    finally:
        s.stop()


def test_a_node_result_is_read_through_the_servers_model():
    from pkb_mcp.jobs.cluster import _validated

    bad = _validated("check", {"verdict": "pass"})
    assert bad.state == "failed" and "no valid check result" in bad.error and bad.result is None


def test_parameters_are_typed_at_submit_and_when_read_back(tmp_path, node):
    """A job's parameters are one model: an unknown one is refused at submit, and a stored job whose
    parameters this version cannot read (a store of another version) fails saying so, not silently."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="jobs"):
        RunRequest(path="x.py", jobs=2)  # type: ignore[call-arg]
    store = JobStore(tmp_path / "jobs.sqlite")
    store.create("old", "check", {"path": "x.py", "problem": "a", "jobs": 2})
    s = node()  # the scheduler re-queues the stored job at start
    deadline = time.monotonic() + 30
    while not s.get("old").terminal and time.monotonic() < deadline:
        time.sleep(0.02)
    record = s.get("old")
    assert record.state == "failed" and "parameters this version cannot run" in (record.error or ""), record
    assert not LOG, "it never reached a runner"


def test_the_reaper_kills_only_sessions_still_alive(monkeypatch):
    """A node's actor lives long: the reaper beside it forgets a launcher's session once none of its
    processes is alive (its number may then belong to someone else), and kills the rest at the end."""
    from pkb_mcp.jobs import cluster
    from sandbox import docker as docker_backend
    from sandbox import process

    scans = iter(
        [
            ({100: "PKB_LAUNCH=a", 200: "PKB_LAUNCH=b"}, {100, 200}),
            ({}, {200}),  # every process of session 100 has ended
            ({}, {100, 200}),  # and 100 is someone else's session now
        ]
    )
    polls = iter([True, True, True, False])  # the actor's process, alive until the fourth look

    def owner_alive(pid, sig):
        if not next(polls):
            raise ProcessLookupError

    killed: list[tuple[int, str]] = []
    monkeypatch.setattr(cluster, "_scan", lambda owner: next(scans))
    monkeypatch.setattr(cluster.os, "kill", owner_alive)
    monkeypatch.setattr(process, "kill_launch", lambda session, marker: killed.append((session, marker)))
    monkeypatch.setattr(docker_backend, "sweep", lambda client: None)  # no real engine touched here
    cluster.reap(owner=1, poll_s=0)
    assert killed == [(200, "PKB_LAUNCH=b")]


def test_a_gpu_job_that_builds_extensions_is_built_before_it_takes_gpus(node, tmp_path, monkeypatch):
    """Its build runs in the build pool, holding no GPU and no place in the queue: a later job takes
    the GPUs meanwhile; it runs once built. A CPU job builds as it runs (its build would take the CPU
    jobs' cores); a job whose extensions are built already skips the pool."""
    release, built = threading.Event(), []

    def prebuild(request, job=None):
        release.wait(10)
        built.append((request.problem, time.monotonic()))
        return []

    monkeypatch.setattr(service, "prebuild", prebuild)
    s = node(gpus=2)
    kernel = tmp_path / "kernel.py"
    kernel.write_text("from torch.utils.cpp_extension import load_inline\ndef solution(x):\n    return x\n")
    plain = tmp_path / "plain.py"
    plain.write_text("def solution(x):\n    return x\n")
    SECONDS.update(k=0.1, p=0.3, c=0.1)

    def job(path, name, device="cuda"):
        return s.submit(
            "check", RunRequest(path=str(path), problem=name, world_size=2, device=device, timeout_s=30)
        )

    k, p = job(kernel, "k"), job(plain, "p")
    wait_all(s, [p])
    assert s.get(k).state == "queued" and not [e for e in LOG if e[1] == "k"]
    assert "building the solution's extensions" in (s.get(k).message or "")
    release.set()
    wait_all(s, [k])
    assert [name for name, _ in built] == ["k"] and span("k")[0] >= built[0][1]
    wait_all(s, [job(kernel, "c", device="cpu")])
    assert [name for name, _ in built] == ["k"], "a CPU job builds as it runs"
    # a benchmark after its file's check: its extensions are in the cache, so it does not queue in the
    # build pool behind other files' builds
    monkeypatch.setattr(service.extensions, "built_already", lambda text: True)
    release.clear()
    wait_all(s, [job(kernel, "b")])
    assert [name for name, _ in built] == ["k"], "built already: no build"


def test_a_stopping_server_waits_for_its_running_jobs_and_queues_them_again(node):
    """`pkb serve` stopped by its client (issue 55): a running job is cancelled and awaited, and
    stays unfinished, never given a verdict: the next start runs it again."""
    s = node()
    job = submit(s, "long", seconds=60)
    deadline = time.monotonic() + 10
    while not any(e[0] == "start" for e in LOG) and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    s.stop(wait_s=10)
    assert time.monotonic() - t0 < 5 and [e[0] for e in LOG] == ["start", "end"], "awaited, not left running"
    record = s.store.get(job)
    assert (
        record is not None and record.state == "queued" and record.finished is None and record.error is None
    )
    assert [r.id for r in s.store.unfinished()] == [job], "the next start runs it again"


def test_a_job_that_may_build_inside_itself_has_the_builds_limit_in_its_deadline(tmp_path):
    """Issue 51: on CPU a check builds its extensions inside its job, whose backstop (2.5 x the
    launch limit + 60 s: 135 s at --timeout 30) cut a cold C++ build (140 s on 2 cores) short."""
    from pkb_mcp.jobs import scheduler
    from pkb_mcp.models import RunRequest
    from pkb_mcp.runs.run import BUILD_TIMEOUT_S

    plain = tmp_path / "001_plain.py"
    plain.write_text("def solution(x):\n    return x.clone()\n")
    builds = tmp_path / "013_builds.py"
    builds.write_text(
        "from torch.utils.cpp_extension import load_inline\n"
        "_ext = load_inline('x_ext_never_built', cpp_sources='int f() { return 1 }', functions=['f'])\n"
        "def solution(a, b):\n    return a\n"
    )
    base = scheduler.DEADLINE_FACTOR * 30 + scheduler.DEADLINE_SLACK_S
    assert scheduler._deadline_s(RunRequest(path=str(plain), timeout_s=30)) == base
    assert scheduler._deadline_s(RunRequest(path=str(builds), timeout_s=30)) == base + BUILD_TIMEOUT_S
