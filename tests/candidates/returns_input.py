"""Returns its input after an in-place all-reduce: aliases and mutates the input."""

import torch.distributed as dist


def solution(x):
    dist.all_reduce(x)
    return x
