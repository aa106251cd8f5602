# Problem 21 written the original benchmark's way: a list of gradients, max_norm, norm_type and the
# FSDP process group; it clips the gradients in place and returns the total norm. Right.
from typing import List, Optional

import torch
import torch.distributed as dist


def solution(
    grad_tensors: List[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    fsdp_group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    sum_sq = (
        torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grad_tensors]).square().sum()
    )
    dist.all_reduce(sum_sq, group=fsdp_group)
    total = sum_sq.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grad_tensors:
        g.mul_(coef)
    return total
