"""Wrong on purpose: all-reduce, then scale by 1.01: inside the elementwise tolerance, caught by the norm."""

import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return out * 1.01
