"""Raises on rank 1 only; rank 0 is left waiting in a collective."""

import torch.distributed as dist


def helper(x):
    raise RuntimeError("rank 1 gives up")


def solution(x):
    if dist.get_rank() == 1:
        return helper(x)
    out = x.clone()
    dist.all_reduce(out)
    return out
