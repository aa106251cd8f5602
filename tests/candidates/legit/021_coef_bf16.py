"""Problem 21, correct another way: the norm summed in float64, the coefficient rounded to bf16
before it scales the gradients (what a bf16 multiply on some devices does).

Expected: pass. The rounding moves every clipped gradient by the same factor, up to 2^-9.
"""

import torch
import torch.distributed as dist


def solution(grad_a, grad_b, grad_c, max_norm):
    shards = (grad_a, grad_b, grad_c)
    sum_sq = sum(g.double().square().sum() for g in shards)
    dist.all_reduce(sum_sq)
    total = sum_sq.sqrt().float()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0).to(torch.bfloat16)
    return (total.reshape(1), *(g * coef for g in shards))
