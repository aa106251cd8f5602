from typing import List, Optional

import torch
import torch.distributed as dist


def solution(
    grad_tensors: List[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    fsdp_group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    total = sum(
        torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) ** norm_type for g in grad_tensors
    )
    dist.all_reduce(total, group=fsdp_group)
    total = total ** (1.0 / norm_type)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grad_tensors:
        g.mul_(coef)  # clipped in place
    return total
