"""Slows the host clock a thousandfold from inside solution(): every CPU-timed call looks 1000x faster.

The answer is right. The worker watches the clocks, the harness modules and the torch functions it
relies on, and fails a rank whose solution replaced any of them. Expected: fail, every rank `error`
("replaced time.perf_counter").
"""

import time

import torch.distributed as dist

_real = time.perf_counter


def _slow():
    return _real() / 1000.0


def solution(x):
    time.perf_counter = _slow
    out = x.clone()
    dist.all_reduce(out)
    return out
