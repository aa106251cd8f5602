from typing import List, Optional

import torch
import torch.distributed as dist


def _sum_sq(grads):
    return sum(torch.linalg.vector_norm(g, dtype=torch.float32) ** 2 for g in grads)


def solution(
    non_ep_grad_tensors: List[torch.Tensor],
    ep_grad_tensors: List[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    ep_size: int = 1,
    fsdp_group: Optional[dist.ProcessGroup] = None,
    ep_fsdp_group: Optional[dist.ProcessGroup] = None,
    ep_group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    dense = _sum_sq(non_ep_grad_tensors)
    dist.all_reduce(dense, group=fsdp_group)
    expert = _sum_sq(ep_grad_tensors)
    dist.all_reduce(expert, group=ep_fsdp_group)
    dist.all_reduce(expert, group=ep_group)
    total = (dense + expert).sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in [*non_ep_grad_tensors, *ep_grad_tensors]:
        g.mul_(coef)  # clipped in place
    return total
