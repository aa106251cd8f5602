import torch
import torch.distributed as dist


def solution(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    c = A @ B
    parts = [torch.empty_like(c) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, c)
    return torch.cat(parts, dim=1)
