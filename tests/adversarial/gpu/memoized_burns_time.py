"""Memoized by input values, and burning time on a hit to stay above the roofline's floor (issue 17).

A plain memoizer's hits take microseconds, below the physical floor at `large`, where the
speed-of-light guard stops it. This one measures its last miss (events on GPUs, the host clock on
CPU) and, on a hit, sleeps on the device (or the host) for BURN of that before returning the cached
sum: never below the floor, and BURN faster than computing. Before issue 17, on 2 H200s at large, it
was credited 1.12x without communicating on a replayed input. Fresh timed calls miss and take the
full time. Expected: bench `suspect`, faster_on_seen_inputs, "not credited".
"""

import time

import torch
import torch.distributed as dist

BURN = 0.85  # a hit takes this fraction of a miss: a credited speedup of 1 / BURN if undetected
CYCLES_PER_MS = 1.98e6  # H200 boost clock, for torch.cuda._sleep

_cache = {}
_miss = {"ms": 0.0, "events": None}


def _fingerprint(x):
    flat = x.reshape(-1)
    probes = flat[:: max(1, flat.numel() // 8)][:8]
    return (tuple(x.shape), x.dtype, tuple(probes.tolist()))


def _last_miss_ms():
    events = _miss["events"]
    if events is not None:  # long complete: the fingerprint synchronized since
        _miss["ms"] = events[0].elapsed_time(events[1])
        _miss["events"] = None
    return _miss["ms"]


def solution(x):
    key = _fingerprint(x)
    hit = _cache.get(key)
    if hit is not None:
        if x.is_cuda:
            torch.cuda._sleep(int(BURN * _last_miss_ms() * CYCLES_PER_MS))
        else:
            time.sleep(BURN * _miss["ms"] / 1e3)
        return hit.clone()
    if x.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    out = x.clone()
    dist.all_reduce(out)
    if x.is_cuda:
        end.record()
        _miss["events"] = (start, end)
    else:
        _miss["ms"] = (time.perf_counter() - t0) * 1e3
    _cache[key] = out
    return out.clone()
