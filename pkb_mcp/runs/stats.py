"""Timing statistics from the harness's samples, and the speedup between two of them.

The host's share of a call: the median of the calls timed by the host clock alone, from an idle
device until it is idle again (harness/timing.py, Timer.host_clock), beside the timed figure, with a
warning where it exceeds that figure by the event gap's margin below.

A sample is one timed call: the slowest rank's time (device events on GPU, host clock on CPU).
The reported time is the median (with several launches, the median of the launches' medians); the
spread is the interquartile range over all samples. Speedup = reference median / candidate median,
with a range from the quartiles (reference q1 / candidate q3 up to reference q3 / candidate q1).
"""

from __future__ import annotations

import math
import statistics
from typing import cast

from harness.contracts import TimingRecord
from pkb_mcp.models import TimingStats

# How far from 1.00x a benchmark of identical code lands on H200s (reference and candidate in
# separate processes): up to 5.1% in 105 benchmarks (W=2, 35 problems, 3 calls each, all but the
# host-synchronous problem 10; docs/gpu-results.md, "Identical code benchmarked against itself"). A
# speedup closer to 1 than this is no evidence of a difference.
RUN_TO_RUN_SPREAD = 0.05
# The same on CPU, where ranks share a few cores with everything else the host runs: the reference
# of problem 1 benchmarked against itself on a 2-core host measured 1.562x on its replayed calls and
# 0.684x (1/1.46) on its fresh ones in one benchmark (docs/measurement.md, "within_noise"). A CPU
# speedup within 60% of 1.00x is no evidence of a difference. Nor, on CPU, is one whose quartile
# range includes 1.00x: the same benchmark in a 2-core test run (2026-11-27) measured 0.573x
# (0.381-2.083).
CPU_RUN_TO_RUN_SPREAD = 0.6

# The device clock missed work the host waited for (side streams, threads): the wall-clock median
# exceeds the event median by more than this fraction plus the alignment overhead.
EVENT_GAP_FRACTION = 0.25
EVENT_GAP_FLOOR_MS = 0.2

# Calls vary widely (interquartile range above this fraction of the median, device clock): on H200s
# every reference stayed at or below 0.20 except problem 10's, which waits on the host inside each
# call (0.27-0.77), and whose speedup against itself ranged 0.76-1.62x (docs/gpu-results.md,
# "Identical code benchmarked against itself").
WIDE_SPREAD = 0.25


# Replay advantage (docs/measurement.md): a side whose fresh calls are slower than the replayed calls
# around them by more than this factor (relative to the reference's own advantage, where that
# exceeds 1), and significantly so (one-sided sign test, REPLAY_P), is flagged as faster on input
# sets it has seen. On CPU (bench/cpu-runs/2026-11-24/refs_memo_w2.jsonl: 2 cores shared with other
# test runs, every reference against itself, an honest state-keeping candidate three times) honest
# sides reached 1.91 (1.76 relative to their reference), with p down to 0.0003: CPU caches are
# not flushed between calls and the host was loaded, so the CPU limit is high; memoizers measured
# 24-27x. On GPUs the calls being paired are microseconds apart in one process, with L2 flushed
# before each (on 4 H200s, memory placements of identical code within a process spread under 1%,
# docs/gpu-results.md, "Memoization on GPUs"): 1.10 leaves a memoizer at most 10%.
REPLAY_ADVANTAGE_LIMIT = {"cuda": 1.10, "cpu": 4.0}
REPLAY_P = 0.01


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        v = samples[0]
        return v, v, v
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[0], q[1], q[2]


def log_spread(values: list[float]) -> float | None:
    """Standard deviation of the logarithms (0.01 = 1%); None for fewer than two or a non-positive."""
    if len(values) < 2 or min(values) <= 0:
        return None
    return statistics.stdev(math.log(v) for v in values)


def launch_median(samples: list[float], launches: list[int]) -> tuple[float, float | None]:
    """(median, spread) of samples from consecutive launches of `launches` samples each: the median
    of the launches' medians, and the standard deviation of their logarithms (None for one launch)."""
    medians = []
    start = 0
    for n in launches:
        medians.append(statistics.median(samples[start : start + n]))
        start += n
    return statistics.median(medians), log_spread(medians)


def pool_launches(records: list[TimingRecord]) -> TimingRecord:
    """One timing record from the records of a side's launches, in the order they ran: samples
    concatenated (timed-call indices continue across launches), each launch's sample count kept
    (`launch_samples`)."""
    pooled = cast(TimingRecord, dict(records[-1]))
    offsets = [0]
    for r in records:
        offsets.append(offsets[-1] + len(r["device_ms"]))
    pooled["device_ms"] = [x for r in records for x in r["device_ms"]]
    pooled["wall_ms"] = [x for r in records for x in r["wall_ms"]]
    pooled["timed_output_mismatches"] = [
        off + int(i)
        for r, off in zip(records, offsets, strict=False)
        for i in r.get("timed_output_mismatches", [])
    ]
    pooled["fresh_ms"] = [x for r in records for x in r.get("fresh_ms", [])]
    pooled["fresh_wall_ms"] = [x for r in records for x in r.get("fresh_wall_ms", [])]
    # each fresh call's following replayed sample, in the pooled samples' indices
    pooled["fresh_after"] = [
        off + int(i) for r, off in zip(records, offsets, strict=False) for i in r.get("fresh_after", [])
    ]
    pooled["warmup_calls"] = sum(int(r["warmup_calls"]) for r in records)
    pooled["sampled_ms"] = sum(float(r.get("sampled_ms", 0.0)) for r in records)
    pooled["alignment_sleep_us"] = max(float(r.get("alignment_sleep_us", 0.0)) for r in records)
    pooled["launch_samples"] = [len(r["device_ms"]) for r in records]
    pooled["host_clock_ms"] = [x for r in records for x in r.get("host_clock_ms", [])]
    pooled["host_waited_calls"] = sum(int(r.get("host_waited_calls", 0)) for r in records)
    reasons = [str(r["stop_reason"]) for r in records]
    if "outputs changed while timing" in reasons:
        pooled["stop_reason"] = "outputs changed while timing"
    elif len(set(reasons)) > 1:
        pooled["stop_reason"] = "; ".join(f"launch {i + 1}: {why}" for i, why in enumerate(reasons))
    return pooled


def sign_test_p(slower: int, n: int) -> float:
    """One-sided sign test: the chance of at least `slower` of `n` fair coin flips coming up slower."""
    return sum(math.comb(n, i) for i in range(slower, n + 1)) / 2**n


def replay_advantage(
    samples: list[float], fresh: list[float], after: list[int]
) -> tuple[float | None, float | None]:
    """(median, p) of the ratios of each fresh call's time to the mean of the replayed samples just
    before and after it (`after[k]`: the index of the replayed sample that followed fresh call k), and
    the sign test's p that fresh calls are no slower than their neighbours; (None, None) without
    fresh calls."""
    ratios = []
    for f, a in zip(fresh, after, strict=True):
        around = [samples[j] for j in (a - 1, a) if 0 <= j < len(samples)]
        if around and min(around) > 0:
            ratios.append(f / statistics.fmean(around))
    if not ratios:
        return None, None
    return statistics.median(ratios), sign_test_p(sum(r > 1 for r in ratios), len(ratios))


def summarize(record: TimingRecord) -> tuple[TimingStats, list[str]]:
    """TimingStats from a harness timing record, plus warnings about the measurement itself."""
    events = [float(x) for x in record["device_ms"]]
    walls = [float(x) for x in record["wall_ms"]]
    if not events:
        raise ValueError("the timing record holds no samples")
    launches = [int(n) for n in record.get("launch_samples") or [len(events)]]
    if sum(launches) != len(events) or len(walls) != len(events) or min(launches) < 1:
        raise ValueError("the timing record's launches do not add up to its samples")
    q1, _, q3 = quartiles(events)
    med, launch_spread = launch_median(events, launches)
    wall_med = statistics.median(walls)
    fresh = [float(x) for x in record.get("fresh_ms") or []]
    fresh_walls = [float(x) for x in record.get("fresh_wall_ms") or []]
    after = [int(i) for i in record.get("fresh_after") or []]
    if not len(fresh) == len(fresh_walls) == len(after):
        raise ValueError("the timing record's fresh calls do not add up")
    warnings = []
    if wall_med > med * (1 + EVENT_GAP_FRACTION) + EVENT_GAP_FLOOR_MS:
        warnings.append(
            f"device events ({med:.4g} ms) missed work the host waited for ({wall_med:.4g} ms): work on a "
            "side stream or thread? The wall-clock figures are reported instead."
        )
        q1, _, q3 = quartiles(walls)
        med, launch_spread = launch_median(walls, launches)
        events = walls
        fresh = fresh_walls
    elif record["clock"] == "cuda events" and q3 - q1 > WIDE_SPREAD * med:
        warnings.append(
            f"calls vary widely (interquartile range {(q3 - q1) / med:.0%} of the median): typically "
            "waiting on the host inside the call; a speedup from such times is unreliable"
        )
    host = [float(x) for x in record.get("host_clock_ms") or []]
    waited = int(record.get("host_waited_calls", 0))
    host_med = statistics.median(host) if host else None
    if host_med is not None and host_med > med * (1 + EVENT_GAP_FRACTION) + EVENT_GAP_FLOOR_MS:
        waits = f", {waited} of {len(events)} timed calls waited on the device" if waited else ""
        warnings.append(
            f"by the host clock a call takes {host_med:.4g} ms (from an idle device until it is idle "
            f"again, median of {len(host)} calls), the timed figure {med:.4g} ms: the host's share of "
            f"each call (queueing work, waiting on the device{waits}) is not in the timed figure"
        )
    stats = TimingStats(
        median_ms=med,
        q1_ms=q1,
        q3_ms=q3,
        iqr_ms=q3 - q1,
        min_ms=min(events),
        samples=len(events),
        stop_reason=str(record["stop_reason"]),
        sampled_ms=float(record.get("sampled_ms", 0.0)),
        warmup_calls=int(record["warmup_calls"]),
        input_sets=int(record["input_sets"]),
        clock=str(record["clock"]),
        wall_median_ms=wall_med,
        launches=len(launches),
        launch_spread=launch_spread,
        host_clock_median_ms=host_med,
        host_waited_calls=waited,
    )
    stats.fresh_calls = len(fresh)
    if fresh:
        stats.fresh_median_ms = statistics.median(fresh)
        stats.replay_advantage, stats.replay_advantage_p = replay_advantage(events, fresh, after)
    return stats, warnings


def seen_inputs_advantage(reference: TimingStats, candidate: TimingStats) -> float | None:
    """The candidate's replay advantage relative to the reference's where that exceeds 1 (an effect
    of the harness on this problem, which identical code would show too); None without fresh calls."""
    if candidate.replay_advantage is None:
        return None
    return candidate.replay_advantage / max(1.0, reference.replay_advantage or 1.0)


def faster_on_seen_inputs(reference: TimingStats, candidate: TimingStats, device: str) -> bool:
    """Whether the candidate is much faster on input sets it has seen than on fresh ones: its
    relative replay advantage above the device's limit, and its fresh calls slower than their
    neighbours more often than chance allows (REPLAY_P)."""
    relative = seen_inputs_advantage(reference, candidate)
    p = candidate.replay_advantage_p
    limit = REPLAY_ADVANTAGE_LIMIT.get(device, REPLAY_ADVANTAGE_LIMIT["cpu"])
    return relative is not None and p is not None and relative > limit and p < REPLAY_P


def speedup(reference: TimingStats, candidate: TimingStats) -> tuple[float, float, float]:
    """(speedup, low, high): medians' ratio, and the ratio range from the quartiles."""
    return (
        reference.median_ms / candidate.median_ms,
        reference.q1_ms / candidate.q3_ms,
        reference.q3_ms / candidate.q1_ms,
    )


def run_to_run_spread(device: str) -> float:
    return RUN_TO_RUN_SPREAD if device == "cuda" else CPU_RUN_TO_RUN_SPREAD


def within_noise(
    speedup: float,
    device: str = "cuda",
    fresh_speedup: float | None = None,
    quartile_range: tuple[float, float] | None = None,
) -> bool:
    """Whether identical code could have given this speedup: within the device's run-to-run spread
    either way, the fresh calls' speedup on the other side of 1.00x (the two figures of one
    benchmark disagree on which side is faster), or on CPU a quartile range that includes 1.00x."""
    return (
        abs(math.log(speedup)) < math.log1p(run_to_run_spread(device))
        or sides_disagree(speedup, fresh_speedup)
        or range_includes_one(device, quartile_range)
    )


def range_includes_one(device: str, quartile_range: tuple[float, float] | None) -> bool:
    """On CPU, whether the speedup's quartile range includes 1.00x: the middle halves of the two
    sides' calls overlap on cores shared with everything else the host runs. (On GPUs the spread
    within a launch is a fraction of a percent, and a wide range is the solution's own.)"""
    return device != "cuda" and quartile_range is not None and quartile_range[0] <= 1.0 <= quartile_range[1]


def sides_disagree(speedup: float, fresh_speedup: float | None) -> bool:
    """Whether the replayed and the fresh calls' speedups fall on opposite sides of 1.00x."""
    return fresh_speedup is not None and (speedup - 1.0) * (fresh_speedup - 1.0) < 0
