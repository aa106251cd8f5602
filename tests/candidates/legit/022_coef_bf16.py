"""Problem 22, correct another way: one all-reduce of both sums of squares (float64) over the world,
the coefficient rounded to bf16 before it scales the gradients.

Expected: pass. The rounding moves both clipped gradients by the same factor, up to 2^-9.
"""

import torch
import torch.distributed as dist


def solution(grad_dense, grad_expert, max_norm):
    sum_sq = grad_dense.double().square().sum() + grad_expert.double().square().sum()
    dist.all_reduce(sum_sq)
    total = sum_sq.sqrt().float()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0).to(torch.bfloat16)
    return total.reshape(1), grad_dense * coef, grad_expert * coef
