"""Communicates in fp8 (e4m3): half the bytes of bf16, 3 mantissa bits.

Each contribution is rounded to fp8 before the sum (simulated here with a round trip, since gloo
has no fp8 all-reduce), an error of up to 1/16 of each value: far beyond the bf16 tolerance.
Expected: fail, every rank `wrong` with elementwise mismatches.
"""

import torch
import torch.distributed as dist


def solution(x):
    out = x.to(torch.float8_e4m3fn).to(x.dtype)
    dist.all_reduce(out)
    return out
