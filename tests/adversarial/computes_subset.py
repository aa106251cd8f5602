"""Reduces only the first half of the rows and returns zeros for the rest (half the traffic).

Expected: fail, every rank `wrong`, the first mismatch in the first row of the second half.
"""

import torch
import torch.distributed as dist


def solution(x):
    out = torch.zeros_like(x)
    half = x.shape[0] // 2
    top = x[:half].clone()
    dist.all_reduce(top)
    out[:half] = top
    return out
