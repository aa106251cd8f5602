"""Reduces to rank 0 only (half an all-reduce); the other ranks return their own input.

Expected: fail; rank 0 passes, every other rank is `wrong`.
"""

import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.reduce(out, dst=0)
    return out
