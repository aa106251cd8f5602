"""Sandboxes started ahead of need (sandbox/pool.py): a warm launch gives the same outputs as a cold one,
each warm sandbox serves one launch, unused ones expire, and closing the pool leaves nothing behind.
Process backend here (integration tier; the pool's bookkeeping with stand-in sandboxes is fast);
tests/test_sandbox_docker.py runs the same with containers."""

import os
import secrets
import time

import pytest

import sandbox.base
from pkb_mcp.launches import enable_warm_pool, run_launch
from pkb_mcp.models import RunRequest
from sandbox.pool import WarmKey
from sandbox.process import ProcessBackend

from .conftest import cpu_launch, launch_processes, wait_for


def request(seeds, world_size=2):
    return cpu_launch(seeds=seeds, world_size=world_size)


def same_outputs(a, b):
    assert a.outputs.keys() == b.outputs.keys() and a.outputs
    for k in a.outputs:
        for x, y in zip(a.outputs[k].tensors, b.outputs[k].tensors, strict=True):
            assert x.equal(y)


def run_pool_lifecycle(backend, launches_dir):
    pool = enable_warm_pool(backend)
    assert pool is not None
    try:
        seeds = [secrets.randbits(62) for _ in range(2)]
        cold = run_launch(request(seeds), backend)
        assert cold.ok and not cold.warm
        pool.settle()
        tools = 1 if backend.isolated else 0  # a warm tool sandbox beside them (pkb_mcp/launches.py)
        assert pool.size() - tools == pool.wanted(WarmKey("cpu", (), 2, 1)) == 2, (
            "a finished launch leaves its shape warm"
        )
        warm = run_launch(request(seeds), backend)
        assert warm.ok and warm.warm, "the next launch of the same shape starts warm"
        same_outputs(cold, warm)
        other = run_launch(request(seeds, world_size=4), backend)
        assert other.ok and not other.warm, "another shape starts cold"
    finally:
        pool.close()
    assert pool.size() == 0
    assert list(launches_dir.iterdir()) == [], "closing the pool removes every warm sandbox's directory"
    assert launch_processes(launches_dir) == [], "and every process"


@pytest.mark.integration
@pytest.mark.slow
def test_warm_job_matches_cold_and_close_leaves_nothing(isolated_dirs):
    run_pool_lifecycle(ProcessBackend(), isolated_dirs)


@pytest.mark.integration
def test_unused_warm_sandbox_expires(isolated_dirs, monkeypatch):
    monkeypatch.setattr(sandbox.base, "WARM_IDLE_S", 2.0)
    backend = ProcessBackend()
    pool = enable_warm_pool(backend)
    key = WarmKey("cpu", (), 2, 1)
    try:
        pool.replenish(key)
        pool.settle()
        handles = [s.handle for s in pool._slots[key]]
        assert len(handles) == 2
        for h in handles:
            # the launcher gave up waiting for a launch and its ranks left at once: each reads the end
            # of its input (no sibling holds its pipe open; before that the launcher waited 30 s a rank)
            h.wait(timeout=25)
            assert h.returncode == 0
        assert pool.take(key) is None, "an expired sandbox is never handed out"
    finally:
        pool.close()
    assert list(isolated_dirs.iterdir()) == []
    assert launch_processes(isolated_dirs) == []


def fake_pool(launches_dir, start, per_key, spare=0):
    """A pool whose sandboxes are whatever `start` makes of them: always alive, nothing to discard."""
    from sandbox.pool import WarmPool

    return WarmPool(
        new_dir=lambda launch_id: launches_dir / launch_id,
        start=start,
        alive=lambda handle: True,
        discard=lambda slot: None,
        per_key=per_key,
        spare=spare,
    )


def ready_at_once(started: list):
    """A fake start: the sandbox is ready as soon as it exists; `started` records each one's shape."""

    def start(slot):
        slot.launch_dir.mkdir()
        for r in range(slot.key.world_size):
            (slot.launch_dir / f"rank{r}.ready").touch()  # as a warmed-up launcher's workers leave
        started.append(slot.key)
        return "handle"

    return start


def test_quiet_postpones_starts_until_the_benchmark_ends(isolated_dirs):
    started: list = []
    pool = fake_pool(isolated_dirs, ready_at_once(started), per_key=1)
    key = WarmKey("cpu", (), 2, 1)
    with pool.quiet():
        pool.replenish(key)
        assert started == [] and pool.size() == 0, "nothing starts while a benchmark is timed"
    t0 = time.monotonic()
    pool.settle()
    assert time.monotonic() - t0 < 10, "settle returns once the sandbox is ready"
    assert started == [key] and pool.size() == 1
    assert pool.take(key) is not None and pool.take(key) is None, "a warm sandbox serves one launch"


def test_a_benchmark_of_several_jobs_gets_a_sandbox_for_each(isolated_dirs):
    started: list = []
    pool = fake_pool(isolated_dirs, ready_at_once(started), per_key=1)
    key = WarmKey("cpu", (), 2, 1)
    pool.replenish(key, 4)
    pool.settle()
    assert len(started) == 4 and pool.size() == 4, "one per launch, beyond the pool's usual one"
    pool.replenish(key, 2)
    pool.settle()
    assert len(started) == 4, "no more than asked for while they wait"
    with pool.quiet():
        taken = [pool.take(key) for _ in range(4)]
        assert all(t is not None and t.ready() for t in taken), "every launch's sandbox is ready"
        pool.replenish(key)  # as each launch ends
        assert pool.take(key) is None and len(started) == 4, "nothing starts while timing"
    pool.settle()
    assert len(started) == 5 and pool.size() == 1, "afterwards the pool keeps its usual one"


def test_a_check_on_gpus_finds_both_its_pairs_warm(isolated_dirs, monkeypatch):
    """A check runs two pairs of launches of one shape (its trials, then its unseen-size trial), each
    pair side by side, and a benchmark's pair follows: the server's pool keeps six of a GPU shape
    ready, two of a CPU shape, and PKB_WARM_PER_SHAPE sets both."""
    from pkb_mcp import config

    started: list = []
    pool = fake_pool(isolated_dirs, ready_at_once(started), lambda key: config.warm_per_shape(key.device))
    gpu, cpu = WarmKey("cuda", (0, 1), 2, 1), WarmKey("cpu", (), 2, 1)
    for key in (gpu, cpu):
        pool.replenish(key)
    # (settle does not wait for a GPU shape's starts still in flight: it waits for GPU work only)
    wait_for(lambda: pool.size() == 8, 10, "every start done", poll_s=0.01)
    pool.settle()
    assert started.count(gpu) == 6 and started.count(cpu) == 2
    taken = [pool.take(gpu) for _ in range(6)]
    assert all(t is not None and t.ready() for t in taken), "a check's pairs and a benchmark's start warm"
    monkeypatch.setenv("PKB_WARM_PER_SHAPE", "3")
    assert (pool.wanted(gpu), pool.wanted(cpu)) == (3, 3)
    monkeypatch.setenv("PKB_WARM_PER_SHAPE", "0")
    with pytest.raises(ValueError, match="PKB_WARM_PER_SHAPE"):
        pool.wanted(gpu)


def run_bench_with_pool(backend, isolated_dirs, monkeypatch):
    """A benchmark of two launches a side through `backend` with a warm pool: each of its four launches takes
    a sandbox that finished warming up, started before the timing began."""
    from structlog.testing import capture_logs

    from pkb_mcp import log, problems, service
    from pkb_mcp.runs import run as runs

    log.configure("info")  # warm.take is an info event
    pool = enable_warm_pool(backend)
    monkeypatch.setattr(runs, "select_backend", lambda name: backend)
    steps: list = []
    try:
        with capture_logs() as logs:
            path = problems.suite()[1].path
            r = service.bench(
                RunRequest(problem=1, path=path, world_size=2, device="cpu", launches=2),
                service.JobContext(lambda *a: steps.append(a[:3])),
            )
    finally:
        pool.close()
        log.configure()
    assert r.verdict == "pass", r.message
    takes = [e for e in logs if e["event"] == "warm.take"]
    assert len(takes) == 4 and all(e["hit"] and e["ready"] for e in takes), takes
    # each launch's log says where its time went, stage by stage (each stage's longest over the ranks)
    stages = [e["stages_s"] for e in logs if e["event"] == "launch.end"]
    assert len(stages) == 4 and all(
        list(s)
        == ["setup", "import", "benchmark inputs", "benchmark first calls", "benchmark timing", "teardown"]
        for s in stages
    ), stages
    assert all(s["benchmark timing"] > 0 for s in stages), stages
    # only the last launch may return before its sandbox's end (nothing is timed after it), where
    # the backend ends sandboxes in the background (Docker)
    clean = ["ended_cleanly" in e["sandbox_steps_s"] for e in logs if e["event"] == "launch.end"]
    assert clean == [False, False, False, getattr(backend, "ends_early", False)], clean
    assert steps[0] == (
        0,
        5,
        "starting a sandbox for each of the 4 launches, then timing the reference (launch 1 of 2)",
    )
    assert [s[0] for s in steps] == [0, 1, 2, 3, 5], "progress only ever increases (MCP requires it)"
    assert list(isolated_dirs.iterdir()) == [] and launch_processes(isolated_dirs) == []


@pytest.mark.integration
def test_bench_of_several_jobs_takes_a_warm_sandbox_for_each(isolated_dirs, monkeypatch):
    run_bench_with_pool(ProcessBackend(), isolated_dirs, monkeypatch)


def run_died_report(backend, isolated_dirs, stop, ended):
    """Warm sandboxes stopped by `stop(handle)`: never handed out, and the log says how each ended
    (`ended` is in the description), with each rank's log and whether it had been ready."""
    from structlog.testing import capture_logs

    pool = enable_warm_pool(backend)
    key = WarmKey("cpu", (), 2, 1)
    try:
        pool.replenish(key)
        pool.settle()
        slots = list(pool._slots[key])
        assert len(slots) == 2 and all(s.ready() for s in slots)
        for s in slots:
            stop(s.handle)
        with capture_logs() as logs:
            assert pool.take(key) is None, "a dead sandbox is never handed out"
    finally:
        pool.close()
    died = [e for e in logs if e["event"] == "warm.died"]
    assert len(died) == 2
    for e in died:
        assert e["was_ready"] is True
        assert ended in e["ended"]
        assert set(e["rank_logs"]) == {0, 1}
    assert list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
def test_a_warm_sandbox_that_died_is_reported_with_how_it_ended(isolated_dirs):
    import signal

    def stop(proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    run_died_report(ProcessBackend(), isolated_dirs, stop, f"exit status {-signal.SIGTERM}")


def test_take_prefers_a_sandbox_that_finished_warming_up(isolated_dirs):
    """Of two live sandboxes, the one ready for its launch is handed out first, whatever their order;
    one still warming up is handed out when it is all there is."""

    def start(slot):
        slot.launch_dir.mkdir()
        return "handle"

    pool = fake_pool(isolated_dirs, start, per_key=2)
    key = WarmKey("cpu", (), 2, 1)
    pool.replenish(key)
    pool.settle(timeout_s=0.5)  # never ready: settle gives up
    first, second = pool._slots[key]
    for r in range(2):
        (second.launch_dir / f"rank{r}.ready").touch()
    assert pool.take(key) is second, "the ready one, though it is second"
    assert pool.take(key) is first, "then the one still warming up"
    assert pool.take(key) is None


def two_steps(opened: list, stage_after_s: float = 0.0, ready_text=lambda slot, rank: ""):
    """A fake start of a gated sandbox: its ranks stage (after `stage_after_s`), then wait for the
    pool to open it (GO_NAME) and are ready 50 ms later, each ready file holding `ready_text(slot,
    rank)`; `opened` records each one opened, in order."""
    import threading

    from harness.contracts import GO_NAME

    def warm_up(slot):
        time.sleep(stage_after_s)
        for r in range(slot.key.world_size):
            (slot.launch_dir / f"rank{r}.staged").touch()
        while not (slot.launch_dir / GO_NAME).exists():
            time.sleep(0.005)
        opened.append(slot.launch_id)
        time.sleep(0.05)
        for r in range(slot.key.world_size):  # whole when it appears, as harness/worker.py writes it
            text = ready_text(slot, r)
            if text is not None:  # (else it made the file itself)
                (slot.launch_dir / f"rank{r}.ready.part").write_text(text)
            os.replace(slot.launch_dir / f"rank{r}.ready.part", slot.launch_dir / f"rank{r}.ready")

    def start(slot):
        slot.launch_dir.mkdir()
        threading.Thread(target=warm_up, args=(slot,), daemon=True).start()
        return "handle"

    return start


GPU = WarmKey("cuda", (0, 1), 2, 1)


def staged(pool, key, count) -> bool:
    slots = list(pool._slots.get(key, ()))
    return len(slots) == count and all(s.staged() for s in slots)


def all_ready(pool, key, count, timeout_s=10.0):
    """Wait until `count` sandboxes of the shape are ready, as the pool has seen (settle does not wait
    for closed ones)."""

    def ready() -> bool:
        slots = list(pool._slots.get(key, ()))
        return len(slots) == count and all(s.ready_at is not None for s in slots)

    wait_for(ready, timeout_s, f"{count} ready", poll_s=0.01)
    return list(pool._slots[key])


def test_a_gpu_sandbox_uses_the_gpus_once_opened_and_the_pool_opens_it_when_no_benchmark_times(
    isolated_dirs,
):
    opened: list = []
    pool = fake_pool(isolated_dirs, two_steps(opened), per_key=2)
    pool.replenish(GPU)
    slots = all_ready(pool, GPU, 2)  # opened as soon as staged, then ready
    assert sorted(opened) == sorted(s.launch_id for s in slots)
    for s in slots:
        t = s.times()
        assert 0 <= t["running_s"] <= t["staged_s"] <= t["opened_s"] <= t["ready_s"], t
    pool.close()


def test_a_sandbox_s_gpu_step_times_are_its_slowest_rank_s_and_read_with_limits(isolated_dirs):
    """What each rank's ready file says its GPU step took reaches the pool's log (`times`), the
    slowest rank's for each part; a part a rank gives as anything but seconds, or a file too large,
    counts for nothing, nor does a file that is a link."""
    import json

    said = [
        [{"context_s": 0.5, "group_s": 0.2, "collective_s": 0.1}, {"context_s": 0.7, "group_s": 0.1}],
        [{"context_s": 0.4, "group_s": "fast", "collective_s": 1e9}, {"context_s": True, "group_s": 0.3}],
        [{"context_s": 0.4, "padding": "x" * 600}, {"context_s": 0.4}],
        [{"context_s": 0.4}, "a link"],
    ]
    given: dict = {}

    def ready_text(slot, rank):
        index = given.setdefault(slot.launch_id, len(given))
        if said[index][rank] == "a link":  # to a file that says the right thing: not read
            target = slot.launch_dir / "elsewhere.json"
            target.write_text(json.dumps({"context_s": 0.4}))
            os.symlink(target, slot.launch_dir / f"rank{rank}.ready.part")
            return None
        return json.dumps(said[index][rank])

    pool = fake_pool(isolated_dirs, two_steps([], ready_text=ready_text), per_key=4)
    pool.replenish(GPU)
    slots = all_ready(pool, GPU, 4)
    wait_for(lambda: len(given) == 4, 5, "every sandbox's ranks wrote")
    steps = [s.times().get("gpu_step") for s in sorted(slots, key=lambda s: given[s.launch_id])]
    assert steps == [{"context_s": 0.7, "group_s": 0.2}, None, None, None], steps
    pool.close()


def test_while_a_benchmark_times_gpu_sandboxes_start_but_only_its_own_are_opened(isolated_dirs):
    """Sandboxes taken by a check are replaced at once; a benchmark that begins before they staged
    has the two its launches need opened and ready before its timing, and the others stay closed (no
    GPU work) until it ends; sandboxes started while it times stay closed too."""
    opened: list = []
    pool = fake_pool(isolated_dirs, two_steps(opened, stage_after_s=0.3), per_key=3)
    pool.replenish(GPU)
    all_ready(pool, GPU, 3)
    assert len(opened) == 3
    for _ in range(3):  # a check's launches take them; the pool starts three more
        assert pool.take(GPU) is not None
        pool.replenish(GPU)
    t0 = time.monotonic()
    with pool.quiet(GPU, 2):
        waited = time.monotonic() - t0
        ready = [s for s in pool._slots[GPU] if s.ready()]
        assert len(ready) == 2 and len(opened) == 5, "the benchmark's two, opened once staged, are ready"
        assert waited >= 0.3, "which took their staging and warm-up"
        mine = [pool.take(GPU) for _ in range(2)]
        assert all(s is not None and s.ready() for s in mine), "its launches take those"
        pool.replenish(GPU)  # as its launches end: two more start
        wait_for(lambda: staged(pool, GPU, 3), 10, "they start and stage all the same", poll_s=0.01)
        time.sleep(0.1)  # ten of the pool's looks at them
        assert len(opened) == 5, "none other is opened while it times"
        assert all(s.opened_at is None for s in pool._slots[GPU]), "though they staged"
    all_ready(pool, GPU, 3)
    assert len(opened) == 8, "opened once it ended"
    pool.close()


def test_spare_gpu_sandboxes_stay_staged_until_fewer_than_per_key_are_open(isolated_dirs, monkeypatch):
    """Of a GPU shape the pool keeps `spare` more staged and closed; when a launch takes an open one,
    a spare is opened and a new one starts. A CPU shape has no spares. PKB_WARM_SPARE: 6 on GPUs in
    a batch, else none."""
    from pkb_mcp import config

    opened: list = []
    pool = fake_pool(isolated_dirs, two_steps(opened), per_key=2, spare=2)
    pool.replenish(GPU)
    wait_for(lambda: len(pool._slots[GPU]) == 4 and len(opened) == 2, 10, "four started, two opened", 0.01)
    time.sleep(0.1)
    assert staged(pool, GPU, 4) and len(opened) == 2, "the spares stage and stay closed"
    first = [s for s in pool._slots[GPU] if s.opened_at is not None]
    wait_for(lambda: all(s.ready() for s in first), 10, "the open ones ready", 0.01)
    assert pool.take(GPU) in first, "a launch takes an open one"
    wait_for(lambda: len(opened) == 3, 10, "a spare opened in its place", 0.01)
    pool.replenish(GPU)
    wait_for(lambda: staged(pool, GPU, 4), 10, "and a new one staged", 0.01)
    time.sleep(0.1)
    assert len(opened) == 3 and sum(s.opened_at is not None for s in pool._slots[GPU]) == 2
    assert pool.spares(WarmKey("cpu", (), 2, 1)) == 0
    pool.close()
    shapes = (("cuda", True), ("cuda", False), ("cpu", True))
    spares = [config.warm_spare(device, batch) for device, batch in shapes]
    assert spares == [6, 0, 0], "a batch's GPU shapes only"
    monkeypatch.setenv("PKB_WARM_SPARE", "2")
    assert config.warm_spare("cuda", False) == 2
    monkeypatch.setenv("PKB_WARM_SPARE", "x")
    with pytest.raises(ValueError, match="PKB_WARM_SPARE"):
        config.warm_spare("cuda", True)


def test_a_cpu_sandbox_is_not_gated(isolated_dirs):
    """On CPU warming up takes the cores a benchmark times on: nothing starts while it times (above),
    and a sandbox is never gated."""
    from sandbox.base import warm_setup

    assert not WarmKey("cpu", (), 2, 1).gated and GPU.gated
    assert "gated" not in warm_setup(isolated_dirs, 2, "cpu", 1)
    assert warm_setup(isolated_dirs, 2, "cuda", 1, gated=True)["gated"] is True


def run_gated(backend, isolated_dirs, monkeypatch):
    """The launcher and worker side of gating, with real ranks (CPU standing in for the GPUs): staged
    ranks have no process group until opened; one opened for a benchmark is ready and serves a launch
    warm; one still closed is opened by its launch and serves it too; their outputs are a cold
    launch's."""
    import sandbox.pool

    monkeypatch.setattr(sandbox.pool, "GATED_DEVICES", frozenset({"cuda", "cpu"}))
    key = WarmKey("cpu", (), 2, 1)
    seeds = [secrets.randbits(62)]
    cold = run_launch(request(seeds), backend)
    pool = enable_warm_pool(backend)
    assert pool is not None and key.gated
    try:
        with pool.quiet(key, 1):  # a benchmark of one launch is timing
            pool.replenish(key)  # gated sandboxes start all the same
            wait_for(lambda: staged(pool, key, 2), 120, "both staged", poll_s=0.05)
            wait_for(lambda: any(s.ready() for s in pool._slots[key]), 120, "the reserved one ready", 0.05)
            wait_for(lambda: any(s.steps for s in pool._slots[key]), 10, "its step times read", 0.05)
            steps = next(s.steps for s in pool._slots[key] if s.steps)  # the ranks' own (no GPU: no context)
            assert set(steps) == {"group_s", "collective_s"} and all(0 <= v < 120 for v in steps.values())
            time.sleep(1.0)
            closed = [s for s in pool._slots[key] if not s.ready()]
            # staged with the other, it would have been ready as soon, had it not waited for the go line
            assert len(closed) == 1 and closed[0].opened_at is None, "the other stays closed"
            first = run_launch(request(seeds), backend)  # takes the ready one
            second = run_launch(request(seeds), backend)  # takes the closed one: its launch opens it
        assert first.ok and first.warm and second.ok and second.warm, (first.ranks, second.ranks)
        same_outputs(cold, first)
        same_outputs(cold, second)
    finally:
        pool.close()
    assert list(isolated_dirs.iterdir()) == [] and launch_processes(isolated_dirs) == []


@pytest.mark.integration
def test_gated_sandboxes_wait_before_the_process_group_and_serve_their_launch(isolated_dirs, monkeypatch):
    run_gated(ProcessBackend(), isolated_dirs, monkeypatch)


@pytest.mark.integration
def test_a_gated_sandbox_never_opened_leaves_quietly(isolated_dirs, monkeypatch):
    import sandbox.pool

    monkeypatch.setattr(sandbox.pool, "GATED_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(sandbox.base, "WARM_IDLE_S", 4.0)
    backend = ProcessBackend()
    pool = enable_warm_pool(backend)
    key = WarmKey("cpu", (), 2, 1)
    try:
        with pool.quiet():
            pool.replenish(key)
            wait_for(lambda: len(pool._slots[key]) == 2, 60, "both started", poll_s=0.05)
            for slot in list(pool._slots[key]):
                slot.handle.wait(timeout=25)  # the launcher gave up waiting, and its ranks left at once
                assert slot.handle.returncode == 0
                assert slot.staged() and not slot.ready(), "staged, never opened"
    finally:
        pool.close()
    assert list(isolated_dirs.iterdir()) == [] and launch_processes(isolated_dirs) == []


IMPORT_PROBE = """
import sys

import torch.distributed as dist

LOADED = "torch.utils.cpp_extension" in sys.modules  # when the launch imports the solution


def solution(x):
    if LOADED != EXPECTED:
        raise RuntimeError(f"torch.utils.cpp_extension loaded before the solution: {LOADED}")
    out = x.clone()
    dist.all_reduce(out)
    return out
"""


@pytest.mark.integration
def test_a_warm_rank_has_imported_cpp_extension_and_a_cold_one_has_not(isolated_dirs, tmp_path):
    """A warm sandbox imports torch.utils.cpp_extension while it waits (a solution's load_inline would
    pay it in the launch); a cold launch leaves it to the solutions that use it."""
    backend = ProcessBackend()
    probes = {}
    for expected in (True, False):
        probes[expected] = tmp_path / f"probe_{expected}.py"
        probes[expected].write_text(f"EXPECTED = {expected}\n" + IMPORT_PROBE)
    cold = run_launch(cpu_launch(solution=probes[False]), backend)
    assert cold.ok and not cold.warm, [r.error for r in cold.ranks]
    pool = enable_warm_pool(backend)
    assert pool is not None
    try:
        pool.replenish(WarmKey("cpu", (), 2, 1))
        pool.settle()
        warm = run_launch(cpu_launch(solution=probes[True]), backend)
        assert warm.ok and warm.warm, [r.error for r in warm.ranks]
    finally:
        pool.close()
    assert launch_processes(isolated_dirs) == []


def test_a_process_sandbox_is_discarded_before_its_launcher_has_a_session_of_its_own(tmp_path):
    """The fork server answers as soon as it has forked a launcher, before the launcher makes a session
    of its own, and a forked launcher's environment is the server's: a discard right then finds it
    neither by its session nor by its marker. It must end all the same (it used to be left waiting for
    a launch until its idle end, and the discard, and the pool's close, with it). Here a process in
    the test's own session, without the marker, stands in for it."""
    import subprocess
    import threading

    from sandbox.pool import WarmSlot

    launcher = subprocess.Popen(["sleep", "600"])
    slot = WarmSlot(key=WarmKey("cpu", (), 2, 1), launch_id="0" * 16, launch_dir=tmp_path / "launch")
    slot.launch_dir.mkdir()
    slot.handle = launcher
    try:
        discard = threading.Thread(target=ProcessBackend()._discard, args=(slot,), daemon=True)
        discard.start()
        discard.join(10)
        assert not discard.is_alive(), "the discard waited for a launcher it had not killed"
        assert launcher.returncode is not None and not slot.launch_dir.exists()
    finally:
        launcher.kill()
        launcher.wait()
