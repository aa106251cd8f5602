import pytest

from harness.timing import median_ci_halfwidth
from pkb_mcp import problems, render, roofline
from pkb_mcp.runs import stats

from .conftest import CEIL


def record(device, wall=None, clock="cuda events"):
    return {
        "device_ms": device,
        "wall_ms": wall or device,
        "stop_reason": "precision reached",
        "warmup_calls": 5,
        "input_sets": 2,
        "clock": clock,
    }


def test_summary_reports_median_quartiles_and_samples():
    s, warnings = stats.summarize(record([1.0, 2.0, 3.0, 4.0, 5.0], clock="host perf_counter"))
    assert (s.median_ms, s.q1_ms, s.q3_ms, s.samples, s.min_ms) == (3.0, 2.0, 4.0, 5, 1.0)
    assert warnings == []


def test_widely_varying_device_times_are_flagged_as_unreliable():
    """Problem 10's reference on H200s: calls that wait on the host vary widely, and speedups from
    them do not repeat; the spread every other reference showed passes quietly."""
    _, wide = stats.summarize(record([0.4, 0.45, 0.6, 0.7, 0.9]))
    assert len(wide) == 1 and "vary widely" in wide[0] and "unreliable" in wide[0]
    _, usual = stats.summarize(record([0.09, 0.095, 0.1, 0.105, 0.11]))
    assert usual == []
    _, cpu = stats.summarize(record([0.4, 0.45, 0.6, 0.7, 0.9], clock="host perf_counter"))
    assert cpu == [], "CPU timings are a dry run: their spread says nothing about a GPU"


def test_events_that_miss_work_fall_back_to_wall_clock():
    s, warnings = stats.summarize(record([0.01] * 9, wall=[2.0] * 9))
    assert s.median_ms == 2.0 and "side stream" in warnings[0]


def test_speedup_and_range_from_quartiles():
    ref, _ = stats.summarize(record([2.0, 2.0, 2.0, 2.0]))
    cand, _ = stats.summarize(record([0.9, 1.0, 1.0, 1.1]))
    speed, low, high = stats.speedup(ref, cand)
    assert speed == pytest.approx(2.0) and low < speed < high


def test_median_confidence_shrinks_with_samples():
    few = median_ci_halfwidth([1.0, 2.0, 3.0] * 4)
    many = median_ci_halfwidth([1.0, 2.0, 3.0] * 400 + [2.0] * 1000)
    assert many < few and median_ci_halfwidth([1.0]) == float("inf")


def test_floor_is_largest_term_plus_latency():
    traffic = {"nvlink_bytes": 400e6, "hbm_bytes": 400e6, "flops": 8e12, "rounds": 2}
    r = roofline.floor(1, "x", 4, "pkb", traffic, "bfloat16", time_ms=2.0, limits=CEIL)
    assert r.nvlink_ms == pytest.approx(1.0) and r.hbm_ms == pytest.approx(0.1)
    assert r.compute_ms == pytest.approx(10.0) and r.bound == "compute"
    assert r.floor_ms == pytest.approx(10.01) and r.pct_of_floor == pytest.approx(500.5)
    assert "below the floor" in r.note


def test_latency_bound_when_traffic_is_tiny():
    traffic = {"nvlink_bytes": 1e3, "hbm_bytes": 1e3, "flops": 1.0, "rounds": 2}
    r = roofline.floor(1, "x", 4, "pkb", traffic, "bfloat16", limits=CEIL)
    assert r.bound == "latency" and r.pct_of_floor is None


def test_the_exchange_s_shares_of_an_all_reduce_s_floor_by_hand():
    """Problem 1 at pkb, W = 4: a 1024 x 1024 bf16 matrix (2 MiB) all-reduced, 2 (W-1)/W of it, 3 MiB,
    each way in 2 rounds. At 400 GB/s the bytes take 7.864 us, the rounds 10 us, HBM's 4 MiB 1.049 us:
    a floor of 17.864 us, 44.0% of it the bytes and 56.0% the latency."""
    p = problems.resolve(1)
    r = roofline.floor(1, p.name, 4, "pkb", p.traffic(4, "pkb"), p.dtype, limits=CEIL)
    nvlink_ms, latency_ms = 3 * 2**20 / 400e9 * 1e3, 2 * 5e-3
    assert r.floor_ms == pytest.approx(nvlink_ms + latency_ms) and r.bound == "latency"
    assert r.nvlink_share == pytest.approx(nvlink_ms / (nvlink_ms + latency_ms))
    assert r.latency_share == pytest.approx(latency_ms / (nvlink_ms + latency_ms))
    assert render.binding_line(r) == "binds: latency; the exchange: NVLink 44% + latency 56% of the floor"


def test_a_share_of_a_few_bytes_is_said_to_be_small_and_a_floor_of_nothing_has_no_share():
    """Problem 25's exchange, 56 bytes under a 2 ms compute floor, is not printed as 0% nor as a
    figure in scientific notation; a traffic of nothing gives a floor of 0 and shares of 0."""
    few = roofline.floor(
        25, "x", 4, "large", {"nvlink_bytes": 56, "hbm_bytes": 0, "flops": 1.6e12}, "bfloat16", limits=CEIL
    )
    assert few.bound == "compute" and 0 < few.nvlink_share < 1e-6
    assert "NVLink <0.01% + latency 0% of the floor" in render.binding_line(few)
    nothing = roofline.floor(
        1, "x", 4, "pkb", {"nvlink_bytes": 0, "hbm_bytes": 0, "flops": 0}, "bfloat16", limits=CEIL
    )
    assert nothing.floor_ms == 0 and nothing.nvlink_share == nothing.latency_share == 0


def test_time_budget_counts_real_time_not_just_the_timed_interval(monkeypatch):
    """A call whose clock shows little of its real cost (host work outside the measured interval)
    must still stop at the budget, not run to the sample cap."""
    import itertools
    import time

    import torch
    import torch.distributed as dist

    from harness import timing

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        out = torch.ones(4)
        clock = itertools.cycle([0.01, 0.02])  # never precise enough: only the budget stops it
        monkeypatch.setattr(timing.Timer, "time", lambda self, call: (call(), next(clock), 0.01))
        cfg = {
            "warmup_ms": 0.0,
            "max_warmup": 3,
            "min_samples": 10,
            "max_samples": 100_000,
            "budget_ms": 300.0,
            "precision": 0.0,
        }
        t0 = time.perf_counter()
        rec = timing.run_timing(
            prepare=lambda i: None,
            call_on_set=lambda i: time.sleep(0.005) or out,  # 5 ms of real work the clock misses
            normalize=lambda o: [o],
            judged=[[out]],
            device=torch.device("cpu"),
            cfg=cfg,
            tolerance={"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0},
        )
        took = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    assert rec["stop_reason"] == "time budget spent"
    assert 0.3 <= took < 3.0 and len(rec["device_ms"]) < 150


def test_precision_is_judged_only_after_the_minimum_sampling_span(monkeypatch):
    """Tightly grouped samples reach the precision target at once; sampling still goes on until
    `min_span_ms` of real time has passed, and the record says how long it sampled."""
    import time

    import torch
    import torch.distributed as dist

    from harness import timing

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        out = torch.ones(4)
        monkeypatch.setattr(timing.Timer, "time", lambda self, call: (call(), 0.01, 0.01))
        cfg = {
            "warmup_ms": 0.0,
            "max_warmup": 3,
            "min_samples": 10,
            "max_samples": 100_000,
            "budget_ms": 5000.0,
            "precision": 0.005,
        }

        def sample(min_span_ms):
            t0 = time.perf_counter()
            rec = timing.run_timing(
                prepare=lambda i: None,
                call_on_set=lambda i: time.sleep(0.001) or out,
                normalize=lambda o: [o],
                judged=[[out]],
                device=torch.device("cpu"),
                cfg={**cfg, "min_span_ms": min_span_ms},
                tolerance={"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0},
            )
            return rec, time.perf_counter() - t0

        quick, quick_s = sample(0.0)
        spanned, spanned_s = sample(300.0)
    finally:
        dist.destroy_process_group()
    assert quick["stop_reason"] == spanned["stop_reason"] == "precision reached"
    assert len(quick["device_ms"]) == 10 and quick_s < 0.3
    assert spanned["sampled_ms"] >= 300.0 and spanned_s >= 0.3
    assert len(spanned["device_ms"]) > 50


def test_a_speedup_within_the_run_to_run_spread_is_flagged_as_no_evidence():
    from pkb_mcp.runs import stats

    assert stats.RUN_TO_RUN_SPREAD == 0.05
    for s in (1.0, 1.049, 1 / 1.049, 0.96):
        assert stats.within_noise(s, "cuda"), s
    for s in (1.051, 1 / 1.051, 0.5, 2.0):
        assert not stats.within_noise(s, "cuda"), s


def test_on_cpu_the_band_is_the_cpu_s_and_disagreeing_fresh_calls_are_noise_on_every_device():
    """Identical code measured 1.562x replayed and 0.684x fresh in one CPU benchmark (issue 33)."""
    from pkb_mcp.runs import stats

    assert stats.within_noise(1.562, "cpu") and stats.within_noise(0.684, "cpu")
    assert not stats.within_noise(1.7, "cpu") and not stats.within_noise(1 / 1.7, "cpu")
    assert stats.within_noise(1.562, "cpu", fresh_speedup=0.684)
    assert stats.within_noise(1.2, "cuda", fresh_speedup=0.9), "the two figures disagree on the side"
    assert not stats.within_noise(1.2, "cuda", fresh_speedup=1.15)


def test_on_cpu_a_quartile_range_across_one_is_noise_and_on_gpus_it_is_not():
    """Identical code measured 0.573x (0.381-2.083) in a 2-core test run (2026-11-27)."""
    from pkb_mcp.runs import stats

    assert not stats.within_noise(0.573, "cpu")
    assert stats.within_noise(0.573, "cpu", quartile_range=(0.381, 2.083))
    assert not stats.within_noise(0.573, "cpu", quartile_range=(0.381, 0.99))
    assert not stats.within_noise(1.7, "cpu", quartile_range=(1.01, 2.4))
    wide = (0.9, 1.6)
    assert not stats.within_noise(1.3, "cuda", quartile_range=wide), "a wide range on GPUs is the solution's"


def test_a_side_s_launches_share_one_budget():
    from pkb_mcp.runs.benchmark import GPU_TIMING as cfg
    from pkb_mcp.runs.benchmark import launch_share

    assert launch_share(cfg, 1) == cfg
    four = launch_share(cfg, 4)
    for k in ("warmup_ms", "budget_ms", "min_span_ms"):
        assert four[k] == cfg[k] / 4, k
    assert (four["max_samples"], four["max_warmup"]) == (cfg["max_samples"] // 4, cfg["max_warmup"] // 4)
    assert four["min_samples"] == cfg["min_samples"] and four["precision"] == cfg["precision"]
    assert four["fresh_min"] == cfg["fresh_min"] // 4
    many = launch_share(cfg, cfg["max_samples"])
    assert many["max_samples"] == cfg["min_samples"], "never fewer samples than the minimum"
    assert many["fresh_min"] == 2, "never fewer than 2 fresh calls a launch"


def test_a_side_timed_in_several_launches_is_the_median_of_their_medians():
    import math

    first = {**record([1.0, 1.1, 1.2, 1.3]), "stop_reason": "sample cap", "timed_output_mismatches": []}
    second = {**record([2.0, 2.2, 2.1]), "warmup_calls": 7, "timed_output_mismatches": [1]}
    pooled = stats.pool_launches([first, second])
    assert pooled["device_ms"] == [1.0, 1.1, 1.2, 1.3, 2.0, 2.2, 2.1] and pooled["launch_samples"] == [4, 3]
    assert pooled["timed_output_mismatches"] == [5], "call indices continue across launches"
    assert pooled["stop_reason"] == "launch 1: sample cap; launch 2: precision reached"
    s, _ = stats.summarize(pooled)
    # launch medians: 1.15 and 2.1
    assert s.launches == 2 and math.isclose(s.median_ms, (1.15 + 2.1) / 2)
    assert math.isclose(s.launch_spread, math.log(2.1 / 1.15) / math.sqrt(2))
    assert s.samples == 7 and s.q1_ms == 1.15, "quartiles come from every sample"
    assert s.warmup_calls == record([1.0])["warmup_calls"] + 7
    one = stats.pool_launches([record([1.0, 3.0, 2.0])])
    assert stats.summarize(one)[0].launches == 1 and stats.summarize(one)[0].launch_spread is None
    with pytest.raises(ValueError, match="do not add up"):
        stats.summarize({**pooled, "launch_samples": [3, 3]})
    changed = stats.pool_launches([first, {**second, "stop_reason": "outputs changed while timing"}])
    assert changed["stop_reason"] == "outputs changed while timing"


# ---------------------------------------------------------------- fresh input sets (issue 17)


def test_replay_advantage_pairs_each_fresh_call_with_its_replayed_neighbours():
    samples = [1.0, 1.0, 2.0, 2.0, 1.0]
    # fresh calls after samples 1 and 3 (indices of the replayed sample that followed)
    adv, p = stats.replay_advantage(samples, [3.0, 1.5], [2, 4])
    assert adv == pytest.approx((3.0 / 1.5 + 1.5 / 1.5) / 2) and p == pytest.approx(0.75)
    assert stats.replay_advantage(samples, [], []) == (None, None)
    assert stats.sign_test_p(8, 8) == pytest.approx(1 / 256) and stats.sign_test_p(0, 5) == 1.0


def test_a_side_much_faster_on_seen_inputs_is_flagged_relative_to_the_reference():
    def side(adv, p, fresh=10):
        s, _ = stats.summarize(record([1.0] * 20))
        return s.model_copy(update={"replay_advantage": adv, "replay_advantage_p": p, "fresh_calls": fresh})

    honest = side(1.02, 0.3)
    limit = stats.REPLAY_ADVANTAGE_LIMIT["cuda"]
    assert not stats.faster_on_seen_inputs(honest, side(1.02, 0.2), "cuda")
    assert stats.faster_on_seen_inputs(honest, side(limit * 1.05, 0.001), "cuda")
    assert not stats.faster_on_seen_inputs(honest, side(limit * 1.05, 0.05), "cuda"), "not significant"
    # the reference shows the same effect: the harness, not the candidate
    assert not stats.faster_on_seen_inputs(side(limit * 1.04, 0.001), side(limit * 1.05, 0.001), "cuda")
    assert stats.seen_inputs_advantage(side(0.8, 0.9), side(1.2, 0.01)) == pytest.approx(1.2), "not below 1"
    assert not stats.faster_on_seen_inputs(honest, side(None, None, 0), "cuda")


def test_fresh_calls_pool_with_the_replayed_samples_indices():

    def rec(n, fresh, after):
        return {
            **record([1.0] * n),
            "fresh_ms": fresh,
            "fresh_wall_ms": fresh,
            "fresh_after": after,
            "sampled_ms": 1.0,
            "timed_output_mismatches": [],
        }

    pooled = stats.pool_launches([rec(3, [2.0], [1]), rec(4, [3.0, 4.0], [1, 3])])
    assert pooled["fresh_ms"] == [2.0, 3.0, 4.0] and pooled["fresh_after"] == [1, 4, 6]
    s, _ = stats.summarize(pooled)
    assert s.fresh_calls == 3 and s.fresh_median_ms == 3.0 and s.replay_advantage == 3.0
    with pytest.raises(ValueError, match="fresh calls do not add up"):
        stats.summarize({**pooled, "fresh_after": [1]})


def test_run_timing_interleaves_fresh_calls_outside_the_budget(monkeypatch):
    """Fresh calls come one every `stride` replayed samples after an untimed first use, are kept apart
    from the replayed samples, keep sampling going until `fresh_min` of them, and the time spent
    making their inputs and keeping their outputs does not count against the budget."""
    import time

    import torch

    from harness import timing

    monkeypatch.setattr(timing.Timer, "time", lambda self, call: (call(), 0.01, 0.01))
    made, kept = [], []
    fresh = timing.Fresh(
        prepare=lambda k: made.append(k) or time.sleep(0.02),  # 20 ms a fresh input set
        call=lambda: torch.ones(4),
        record=lambda k, o: kept.append(k),
        max_calls=6,
    )
    cfg = {
        "warmup_ms": 0.0,
        "max_warmup": 3,
        "min_samples": 8,
        "max_samples": 100_000,
        "budget_ms": 100.0,
        "precision": 0.5,
        "fresh_min": 4,
    }
    rec = _timing_alone(cfg, fresh, lambda i: None)
    assert made[0] == -1 and kept[0] == 0, "the first use (k = -1) is neither timed nor kept"
    assert rec["stop_reason"] == "precision reached", "precision waits for 4 fresh calls, not the budget"
    assert len(rec["fresh_ms"]) == 4 == len(kept) and made[1:] == kept == [0, 1, 2, 3]
    assert rec["fresh_after"] == [2, 4, 6, 8], "one every 8 // 4 = 2 replayed samples"
    assert len(rec["device_ms"]) == 9, "fresh calls are not replayed samples; the last has one after it"
    assert rec["sampled_ms"] < 60, "80 ms of making fresh inputs did not count against the budget"


def test_judged_fresh_calls_always_include_calls_that_are_timed():
    """On 2 H200s, a benchmark at `large` once made 24 fresh calls, judged 2 drawn among all 24, and
    timed too few of them to reach either: nothing on fresh inputs was judged. Half of the judged
    ones at least are now drawn among the first `sure`, which timing always makes."""
    import random

    from harness.benchmark import judged_fresh_calls

    for seed in range(200):
        pick = random.Random(seed)
        got = judged_fresh_calls(24, 8, 2, pick)
        assert len(got) == 2 == len(set(got)) and got == sorted(got)
        assert min(got) < 8, got
    # over many draws the later calls are watched as well, and everything fits when few are made
    later = {k for seed in range(200) for k in judged_fresh_calls(24, 8, 4, random.Random(seed)) if k >= 8}
    assert len(later) > 8
    assert judged_fresh_calls(3, 8, 5, random.Random(0)) == [0, 1, 2]


def _timing_alone(cfg, fresh, prepare):
    """run_timing on one gloo rank of this process, on a call returning ones."""
    import torch
    import torch.distributed as dist

    from harness import timing

    out = torch.ones(4)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return timing.run_timing(
            prepare=prepare,
            call_on_set=lambda i: out,
            normalize=lambda o: [o],
            judged=[[out]],
            device=torch.device("cpu"),
            cfg=cfg,
            tolerance={"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0},
            fresh=fresh,
        )
    finally:
        dist.destroy_process_group()


def test_fresh_calls_are_spaced_by_the_sampling_pace_and_made_past_the_budget(monkeypatch):
    """On 2 H200s a fast memoizer's launch made 5 of its 8 fresh calls: the stride came from warm-up
    calls, which run without the alignment sleep, and the budget then ended the launch. The stride is
    sized again from the sampling loop's own pace, and the budget waits for the fresh calls."""
    import itertools
    import types

    import torch

    from harness import timing

    # the pace is a clock of the test's own (real sleeps on a loaded 2-core CI machine ran long
    # enough to size the stride differently: the test measured the machine, not the schedule)
    clock = {"s": 0.0}
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock["s"]))
    monkeypatch.setattr(timing.Timer, "time", lambda self, call: (call(), 0.01, 0.01))
    calls = {"n": 0}
    pace_ms = {"now": lambda n: 0.0}

    def prepare(i):
        calls["n"] += 1
        clock["s"] += pace_ms["now"](calls["n"]) / 1e3

    def run(budget_ms, pace):
        kept = []
        fresh = timing.Fresh(
            prepare=lambda k: None,
            call=lambda: torch.ones(4),
            record=lambda k, o: kept.append(k),
            max_calls=6,
        )
        cfg = {
            "warmup_ms": 0.0,
            "max_warmup": 3,
            "min_samples": 8,
            "max_samples": 100_000,
            "budget_ms": budget_ms,
            "min_span_ms": 160.0,
            "precision": 0.5,
            "fresh_min": 4,
        }
        calls["n"] = 0
        pace_ms["now"] = pace
        return _timing_alone(cfg, fresh, prepare), kept

    # instant in the warm-up (5 probe and 3 warm-up calls, then the host-clock calls), 4 ms a call after it
    before = 8 + timing.HOST_CLOCK_CALLS
    rec, kept = run(1000.0, lambda n: 0.0 if n <= before else 4.0)
    assert kept == [0, 1, 2, 3] and rec["stop_reason"] == "precision reached"
    # from the warm-up's pace the stride would have been thousands of samples; from the loop's
    # (about 4 ms a sample, 160 ms of span, 4 fresh calls) it is about 10
    after = rec["fresh_after"]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert after[0] == timing.RESTRIDE_AT and all(5 <= g <= 15 for g in gaps), after
    assert len(rec["device_ms"]) < 100
    # the pace slows again after the stride was sized: 1 ms a call, then 10 ms, past a 20 ms budget
    rec, kept = run(20.0, lambda n: 0.0 if n <= before else 1.0 if n <= before + timing.RESTRIDE_AT else 10.0)
    assert kept == [0, 1, 2, 3], "the budget does not end the launch before its fresh calls"
    after = rec["fresh_after"]
    # (the stride sized at 1 ms a call put the first at about 36; the span and the budget ran out first)
    assert after == list(range(after[0], after[0] + 4)) and after[0] > timing.RESTRIDE_AT, after


@pytest.mark.integration
@pytest.mark.parametrize(("top_up", "fresh_mib"), [(False, 128), (True, 128), (True, 6)])
def test_a_benchmark_job_saves_the_fresh_calls_outputs(isolated_dirs, top_up, fresh_mib):
    """Every timed call on a fresh input set leaves its output for the host to judge when they fit in
    fresh_bytes (problem 1's output here: 2 MiB a rank), else a subset drawn from the secret seed;
    the reference's launch (`fresh_top_up`) makes the judged outputs a candidate's launch can reach. The
    fresh inputs come from the launch's label: two launches' fresh sets differ."""
    from pkb_mcp import service
    from pkb_mcp.launches import run_launch
    from sandbox.process import ProcessBackend

    from .conftest import cpu_launch

    tcfg = {
        **service.timing_config("cpu"),
        "fresh_label": "job0",
        "fresh_top_up": top_up,
        "fresh_max": 12,
        "fresh_bytes": fresh_mib << 20,
    }
    seeds = [123456789]
    outcome = run_launch(cpu_launch("benchmark", timing=tcfg, seeds=seeds, timeout_s=120), ProcessBackend())
    assert outcome.ok, outcome.ranks
    timed, judged = outcome.timing["fresh_timed"], outcome.timing["fresh_judged"]
    assert timed == len(outcome.timing["fresh_ms"]) >= tcfg["fresh_min"]
    assert judged == (list(range(12)) if fresh_mib == 128 else judged) and len(judged) == min(
        12, fresh_mib // 2
    )
    made = judged if top_up else [k for k in judged if k < timed]
    assert sorted(outcome.fresh_outputs) == [(k, r) for k in made for r in (0, 1)]
    first = outcome.fresh_outputs[(made[0], 0)]
    assert first.meta["aliased_outputs"] == [] and first.meta["mutated_inputs"] == []
    if fresh_mib != 128:
        return
    other = run_launch(
        cpu_launch("benchmark", timing={**tcfg, "fresh_label": "job1"}, seeds=seeds, timeout_s=120),
        ProcessBackend(),
    )
    assert not torch_equal(other.fresh_outputs[(0, 0)].tensors[0], first.tensors[0])


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a, b)
