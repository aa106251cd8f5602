"""Replaces dist.barrier with a no-op: the harness's alignment before each timed call is gone, so a
rank starts its clock whenever it likes. Expected: fail, every rank `error` ("replaced
torch.distributed.barrier").
"""

import torch.distributed as dist


def _no_barrier(*args, **kwargs):
    return None


def solution(x):
    dist.barrier = _no_barrier
    out = x.clone()
    dist.all_reduce(out)
    return out
