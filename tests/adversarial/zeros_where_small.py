"""Zeros wherever the result is smaller than the absolute tolerance (0.05 for problem 1).

Every zeroed element passes the elementwise test (|0 - ref| <= atol), so only the relative error
norm over the whole output can object. Expected: fail, every rank `wrong` ("relative error norm").
"""

import torch
import torch.distributed as dist

ATOL = 0.05  # problem 1's TOLERANCE["atol"]


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return torch.where(out.abs() < ATOL, torch.zeros_like(out), out)
