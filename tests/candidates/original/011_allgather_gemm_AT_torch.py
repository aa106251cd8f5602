import torch
import torch.distributed as dist


def solution(A_local: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    a_t = A_local.t().contiguous()  # [K/W, M]
    parts = [torch.empty_like(a_t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, a_t)
    return torch.cat(parts).t() @ B
