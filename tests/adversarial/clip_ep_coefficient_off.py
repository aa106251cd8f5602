"""Problem 22: the total norm right, the clip coefficient 1.2% too large (issue 17).

Problem 21's hole in its expert-parallel form: the clipped dense and expert gradients are 1.2% off,
hidden before behind the large total norm in one relative norm over all outputs. One all-reduce of
both sums of squares over the world gives the same total as the reference's three groups.
Expected: fail, every rank `wrong`, a gradient output's relative error norm above its bound.
"""

import torch
import torch.distributed as dist


def solution(grad_dense, grad_expert, max_norm):
    sum_sq = torch.stack(
        [torch.linalg.vector_norm(g, dtype=torch.float32).square() for g in (grad_dense, grad_expert)]
    ).sum()
    dist.all_reduce(sum_sq)
    total = sum_sq.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0) * 1.012  # the lie: only in the gradients
    return total.reshape(1), grad_dense * coef, grad_expert * coef
