"""Timing of one solution on every rank, run inside the worker (torch + stdlib only).

Per iteration (GPU): a short device sleep lets every host queue its launches, a one-element
all-reduce then releases all GPUs together, a start event is recorded, the solution runs, an end
event is recorded and the device is synchronized (all streams, so work hidden on side streams is
waited for). The iteration's time is the maximum over ranks of the event interval; the host
wall-clock from the start event's completion to the device synchronization is kept as a
cross-check. On CPU the host clock is the only clock.

The host's share: the sleep hides the host's work of queueing a call, which is right for a call
that never waits on the device, and hides the host work before the first wait of one that does.
So a few calls after the warm-up are timed by the host clock alone, from an idle device to every
stream idle again (`host_clock_ms`), and the sampled calls that returned only after the device had
begun them are counted (`host_waited_calls`).

Inputs rotate through several distinct sets (every argument), and a scratch buffer twice the size of
L2 is written before each call, so inputs come from HBM as in a real step. The first output of
each set is written for the host to judge; every later timed output is compared on the device with
that judged output, so a solution cannot be right once and wrong afterwards. Between rounds through
the sets the worker may also move each set's data into another set's buffers (`rotate`): the same
addresses then hold other inputs, so a result cached by buffer address comes back stale and fails
the comparison.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.contracts import TimingConfig, TimingRecord

# The device sleep before each timed call must outlast the host's work of queueing the call, or
# host overhead leaks into the device time. It is sized from the slowest rank's measured enqueue
# time during warm-up: twice that plus a margin, at ~2 cycles per ns (H200 boost clock), capped.
CYCLES_PER_US = 2000
MIN_SLEEP_US = 50.0
MAX_SLEEP_US = 20_000.0


def median_ci_halfwidth(samples: Sequence[float]) -> float:
    """Half the width of a ~95% distribution-free confidence interval of the median."""
    n = len(samples)
    if n < 8:
        return math.inf
    xs = sorted(samples)
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return (xs[hi] - xs[lo]) / 2


def output_bounds(tolerance: dict[str, Any], index: int) -> dict[str, float]:
    """The bounds of output `index`: its own entry in the problem's TOLERANCE["outputs"] (keyed by
    index; JSON turns the keys into strings), else the problem's default bounds."""
    own = tolerance.get("outputs") or {}
    bounds = own.get(index, own.get(str(index)))
    return bounds if bounds is not None else tolerance


def outputs_match(out: Sequence[torch.Tensor], ref: Sequence[torch.Tensor], tol: dict[str, Any]) -> bool:
    """Device-side check of a timed output against the judged first output of the same inputs, each
    output on its own elementwise bounds."""
    if len(out) != len(ref):
        return False
    for i, (o, r) in enumerate(zip(out, ref, strict=True)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return False
        if not (o.dtype.is_floating_point or o.dtype.is_complex):
            if not torch.equal(o, r):
                return False
            continue
        o64 = o.to(torch.complex128 if o.dtype.is_complex else torch.float64)
        r64 = r.to(o64.dtype)
        b = output_bounds(tol, i)
        if torch.isnan(o64).any().item() or not torch.allclose(o64, r64, atol=b["atol"], rtol=b["rtol"]):
            return False
    return True


@dataclass
class Fresh:
    """Timed calls on input sets never seen before, interleaved with the replayed ones (a cache keyed
    on the replayed inputs' values misses on them). The worker supplies the callables:
    `prepare(k)` makes fresh call k's inputs (outside the clock), `call()` runs the solution on them,
    `record(k, out)` keeps the output for the host to judge (outside the clock). `next` is the k of
    the next fresh call; at most `max_calls` are made in a launch."""

    prepare: Callable[[int], None]
    call: Callable[[], Any]
    record: Callable[[int, Any], None]
    max_calls: int
    next: int = 0

    @property
    def left(self) -> int:
        return max(0, self.max_calls - self.next)


class Timer:
    """Times one call with everything aligned across ranks."""

    def __init__(self, device: torch.device, l2_bytes: int = 0, min_sleep_us: float = MIN_SLEEP_US):
        self.device = device
        self.cuda = device.type == "cuda"
        # written before every timed call so that no input is still in L2 from an earlier call
        self.scratch = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device=device) if self.cuda else None
        self.min_sleep_us = min_sleep_us
        self.sleep_us = min_sleep_us
        self.enqueue_ms = 0.0  # host time to queue the last call (alignment + solution)
        self.waited = False  # the last call returned only after the device had begun it
        if self.cuda:
            self.token = torch.zeros(1, device=device)
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def time(self, call: Callable[[], Any]) -> tuple[Any, float, float]:
        """Returns (output, device ms, host wall ms) for one aligned call on this rank."""
        if self.cuda:
            if self.scratch is not None and self.scratch.numel():
                self.scratch.fill_(1)
            q0 = time.perf_counter()
            torch.cuda._sleep(int(self.sleep_us * CYCLES_PER_US))
            dist.all_reduce(self.token)
            self.start.record()
            out = call()
            self.end.record()
            self.enqueue_ms = (time.perf_counter() - q0) * 1e3
            # the sleep outlasts the queueing of a call that never waits on the device: past it at
            # return, the call waited (or queued slower than ever), and its host work before then
            # overlapped the sleep, outside the events
            self.waited = self.start.query()
            # host wall-clock from the moment the device starts the call until every stream is idle
            self.start.synchronize()
            h0 = time.perf_counter()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - h0) * 1e3
            return out, self.start.elapsed_time(self.end), wall
        dist.barrier()
        h0 = time.perf_counter()
        out = call()
        wall = (time.perf_counter() - h0) * 1e3
        return out, wall, wall

    def host_clock(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """One call by the host clock alone: (output, ms) from an idle device (every stream
        synchronized, the ranks released together) until every stream is idle again. What a caller
        waits for a call, its host work (queueing, waiting on the device) included; on CPU the same
        as a sample."""
        if self.cuda:
            dist.all_reduce(self.token)
            torch.cuda.synchronize()
        else:
            dist.barrier()
        h0 = time.perf_counter()
        out = call()
        if self.cuda:
            torch.cuda.synchronize()
        return out, (time.perf_counter() - h0) * 1e3


# calls timed by the host clock alone after the warm-up (Timer.host_clock): the host's share
HOST_CLOCK_CALLS = 8


def max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


# the sampling iteration after which the fresh calls' stride is sized again from the loop's pace
RESTRIDE_AT = 10


def fresh_stride(cfg: TimingConfig, iter_ms: float, fresh_min: int) -> int:
    """Replayed samples between fresh calls: `fresh_min` of them spread over the minimum sampling
    span (or `min_samples`, whichever holds more samples) at `iter_ms` a sampling iteration."""
    expected = max(cfg["min_samples"], cfg.get("min_span_ms", 0.0) / max(iter_ms, 1e-3))
    return max(1, int(expected // max(fresh_min, 1)))


class _InputSets:
    """Timed calls on the input sets: `prepare(i)` before each and `after_call()` after, outside the
    timed region; with `rotate`, other data moved into the buffers at the start of every round."""

    def __init__(
        self,
        prepare: Callable[[int], None],
        call_on_set: Callable[[int], Any],
        after_call: Callable[[], None] | None,
        rotate: Callable[[], list[int]] | None,
        timer: Timer,
        n_sets: int,
    ):
        self.prepare, self.call_on_set, self.after_call = prepare, call_on_set, after_call
        self.rotate, self.timer = rotate, timer
        self.holds = list(range(n_sets))  # holds[i]: the input set whose data buffer set i holds now

    def timed(self, i: int) -> tuple[Any, float, float]:
        if self.rotate is not None and i == 0:
            self.holds = self.rotate()
        self.prepare(i)
        result = self.timer.time(lambda: self.call_on_set(i))
        if self.after_call is not None:
            self.after_call()
        return result


def run_timing(
    prepare: Callable[[int], None],
    call_on_set: Callable[[int], Any],
    normalize: Callable[[Any], list[torch.Tensor] | None],
    judged: list[list[torch.Tensor]],
    device: torch.device,
    cfg: TimingConfig,
    tolerance: dict[str, Any],
    *,
    rotate: Callable[[], list[int]] | None = None,
    after_call: Callable[[], None] | None = None,
    fresh: Fresh | None = None,
) -> TimingRecord:
    """Warm up, then sample until precision, budget or cap; every rank returns the same record.

    Precision is judged only once `min_span_ms` of real time has been sampled, so that the median
    stands for a stretch of the GPU's running and not for the few milliseconds in which tightly
    grouped samples already meet the precision target.

    `prepare(i)` runs before each call on input set i, outside the timed region. `rotate()`, when
    given, runs at the start of every round through the sets (outside the timed region too): it
    moves other data into the same buffers and returns, for each buffer i, the set whose data it now
    holds, whose judged output the next outputs are compared with. `after_call()` runs as soon as each
    call's clock has stopped (the worker checks there that the solution replaced nothing).

    `fresh`, when given, interleaves timed calls on never-seen inputs with the replayed ones
    (`_FreshSchedule`).
    """
    timer = Timer(device, int(cfg.get("l2_bytes", 0)), float(cfg.get("min_sleep_us", MIN_SLEEP_US)))
    n_sets = len(judged)
    sets = _InputSets(prepare, call_on_set, after_call, rotate, timer, n_sets)
    timed = sets.timed
    warm_calls, iter_ms = _warm_up(timed, timer, n_sets, cfg, device)
    host_ms = _host_clock_calls(prepare, call_on_set, after_call, timer, n_sets, device)
    waited = 0
    sched = _FreshSchedule(fresh, cfg, iter_ms, timer, after_call, device)
    events: list[float] = []
    walls: list[float] = []
    mismatches: list[int] = []
    stop = "sample cap"
    spent = 0.0
    # the budget is real time, alignment and checks included (the slowest rank's, so that every
    # rank stops at the same call): a host-synchronous solution's device interval says little of it
    t_sampling = time.perf_counter()
    while len(events) < cfg["max_samples"]:
        if sched.due(len(events)):
            sched.call(len(events))
            continue
        i = len(events)
        s = i % n_sets
        out, ev, wall = timed(s)
        got = normalize(out)  # None: not the judged output's structure
        bad = 0.0 if got is not None and outputs_match(got, judged[sets.holds[s]], tolerance) else 1.0
        del out
        elapsed = (time.perf_counter() - t_sampling - sched.overhead_s) * 1e3
        ev, wall, bad, spent, w = max_over_ranks([ev, wall, bad, elapsed, float(timer.waited)], device)
        waited += int(w)
        events.append(ev)
        walls.append(wall)
        if bad:
            mismatches.append(i)
            if len(mismatches) >= 3:
                stop = "outputs changed while timing"
                break
        n = len(events)
        if n == RESTRIDE_AT:
            sched.restride(spent / n)
        if n < cfg["min_samples"] or spent < cfg.get("min_span_ms", 0.0):
            continue
        precise = median_ci_halfwidth(events) <= cfg["precision"] * statistics.median(events)
        if precise and not sched.short:
            stop = "precision reached"
            break
        if spent >= cfg["budget_ms"]:
            if sched.short:  # the budget never ends a launch before its fresh calls
                sched.catch_up(n)
                continue
            stop = "time budget spent"
            break
    return {
        "device_ms": events,
        "wall_ms": walls,
        "warmup_calls": warm_calls,
        "stop_reason": stop,
        "sampled_ms": spent,
        "timed_output_mismatches": mismatches,
        "input_sets": n_sets,
        "clock": "cuda events" if device.type == "cuda" else "host perf_counter",
        "alignment_sleep_us": timer.sleep_us if device.type == "cuda" else 0.0,
        "rotated_inputs": rotate is not None,
        "fresh_ms": sched.ms,
        "fresh_wall_ms": sched.walls,
        "fresh_after": sched.after,
        "host_clock_ms": host_ms,
        "host_waited_calls": waited,
    }


def _host_clock_calls(
    prepare: Callable[[int], None],
    call_on_set: Callable[[int], Any],
    after_call: Callable[[], None] | None,
    timer: Timer,
    n_sets: int,
    device: torch.device,
) -> list[float]:
    """HOST_CLOCK_CALLS calls timed by the host clock alone (Timer.host_clock), the slowest rank's
    figure of each: the host's share of a call. Their outputs are not compared."""
    host_ms = []
    for j in range(HOST_CLOCK_CALLS):
        on = j % n_sets
        prepare(on)
        out, ms = timer.host_clock(functools.partial(call_on_set, on))
        if after_call is not None:
            after_call()
        del out
        host_ms.append(max_over_ranks([ms], device)[0])
    return host_ms


def _warm_up(
    timed: Callable[[int], tuple[Any, float, float]],
    timer: Timer,
    n_sets: int,
    cfg: TimingConfig,
    device: torch.device,
) -> tuple[int, float]:
    """Enough calls to cover warmup_ms, sized from the slowest rank's first calls; then the
    alignment sleep sized from the host's enqueue times. Returns (calls made, real ms per call)."""
    probe: list[float] = []
    enqueue: list[float] = []
    for i in range(5):
        _, ev, _ = timed(i % n_sets)
        probe.append(ev)
        enqueue.append(timer.enqueue_ms)
    per_call = max(max_over_ranks([statistics.median(probe)], device)[0], 1e-3)
    warmup = int(min(max(cfg["warmup_ms"] / per_call, 3), cfg["max_warmup"]))
    t_warm = time.perf_counter()
    for i in range(warmup):
        timed(i % n_sets)
        enqueue.append(timer.enqueue_ms)
    # real time per iteration (checks included, the alignment sleep not yet): the fresh calls' first stride
    iter_ms = max_over_ranks([(time.perf_counter() - t_warm) * 1e3 / max(warmup, 1)], device)[0]
    # first calls carry one-off costs (allocation, rendezvous, JIT): size the sleep from the rest
    slowest_enqueue = max_over_ranks([statistics.median(enqueue[len(probe) :])], device)[0]
    timer.sleep_us = min(max(2e3 * slowest_enqueue + MIN_SLEEP_US, timer.min_sleep_us), MAX_SLEEP_US)
    return warmup + len(probe), iter_ms


class _FreshSchedule:
    """When the fresh calls of a sampling loop come, and what they measured. Every decision uses
    figures agreed across ranks, so all ranks call together.

    Fresh calls interleave timed calls on never-seen inputs with the replayed ones: one
    untimed after the warm-up (so that per-address set-up is paid there), then one every `stride`
    replayed samples, the stride sized so that `fresh_min` of them fit in the minimum sampling span
    (sized from the warm-up's pace, then again from the sampling loop's after RESTRIDE_AT samples),
    until the launch's `max_calls`. Their times are kept apart from the replayed samples (`fresh_ms`,
    with `fresh_after`: the index of the replayed sample that followed each), and the time spent
    making their inputs and keeping their outputs does not count against the budget. Neither precision
    nor the budget stops sampling before `fresh_min` of them (or all that are left) were made: past
    the budget, the missing ones alternate with replayed samples.
    """

    def __init__(
        self,
        fresh: Fresh | None,
        cfg: TimingConfig,
        iter_ms: float,
        timer: Timer,
        after_call: Callable[[], None] | None,
        device: torch.device,
    ) -> None:
        self.fresh, self.cfg, self.timer, self.after_call, self.device = fresh, cfg, timer, after_call, device
        self.least = 0
        self.stride = 0
        if fresh is not None and fresh.left:
            fresh.prepare(-1)  # the fresh buffers' first use is warm-up: neither timed nor judged
            timer.time(fresh.call)
            if after_call is not None:
                after_call()
            self.least = min(int(cfg.get("fresh_min", 8)), fresh.left)
            self.stride = fresh_stride(cfg, iter_ms, self.least)
        self.next_at = self.stride
        self.ms: list[float] = []
        self.walls: list[float] = []
        self.after: list[int] = []
        self.overhead_s = 0.0  # making their inputs and keeping their outputs: not the budget's

    @property
    def short(self) -> bool:
        """Fewer fresh calls made than the launch must make (and some left to make)."""
        return self.fresh is not None and self.fresh.left > 0 and len(self.ms) < self.least

    def due(self, samples: int) -> bool:
        return (
            self.fresh is not None and bool(self.stride) and self.fresh.left > 0 and samples >= self.next_at
        )

    def call(self, samples: int) -> None:
        """One timed fresh call, after `samples` replayed samples."""
        fresh = self.fresh
        assert fresh is not None
        k = fresh.next
        fresh.next += 1
        t0 = time.perf_counter()
        fresh.prepare(k)
        t1 = time.perf_counter()
        out, ev, wall = self.timer.time(fresh.call)
        if self.after_call is not None:
            self.after_call()
        t2 = time.perf_counter()
        fresh.record(k, out)
        del out
        self.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
        ev, wall = max_over_ranks([ev, wall], self.device)
        self.ms.append(ev)
        self.walls.append(wall)
        self.after.append(samples)
        self.next_at = samples + self.stride

    def restride(self, iter_ms: float) -> None:
        """The warm-up ran without the alignment sleep: size the stride again from the sampling
        loop's own pace (the slowest rank's, so that every rank picks the same stride)."""
        if self.short:
            self.stride = fresh_stride(self.cfg, iter_ms, self.least)
            self.next_at = min(self.next_at, (self.after[-1] if self.after else 0) + self.stride)

    def catch_up(self, samples: int) -> None:
        """Past the budget: the missing fresh calls alternate with replayed samples."""
        self.stride = 1
        self.next_at = min(self.next_at, samples)
