import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor, dst: int = 0) -> torch.Tensor:
    if dist.get_rank() == dst:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.gather(tensor, gather_list=parts, dst=dst)
        return torch.stack(parts)
    dist.gather(tensor, dst=dst)
    return tensor  # a non-root rank returns its input
