"""Rank 1 leaves with status 0 without returning anything."""

import os

import torch.distributed as dist


def solution(x):
    if dist.get_rank() == 1:
        os._exit(0)
    out = x.clone()
    dist.all_reduce(out)
    return out
