"""Problem 21: the total norm right, the clip coefficient 1.2% too large (issue 17).

Every clipped gradient is 1.2% off, four times what correct solutions differ by (the coefficient
rounded to bf16 or not, the products' rounding), but the total norm (about 2.3 x max_norm, some
5800 at the pkb size) outweighed the three gradients (about 1800) in a relative norm over all
outputs together, and this passed. Expected: fail, every rank `wrong`, a gradient output's
relative error norm above its bound.
"""

import torch
import torch.distributed as dist


def solution(grad_a, grad_b, grad_c, max_norm):
    shards = (grad_a, grad_b, grad_c)
    sum_sq = sum(torch.linalg.vector_norm(g, dtype=torch.float32).square() for g in shards)
    dist.all_reduce(sum_sq)
    total = sum_sq.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0) * 1.012  # the lie: only in the gradients
    return (total.reshape(1), *(g * coef for g in shards))
