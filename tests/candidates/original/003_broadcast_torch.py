import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    out = tensor.clone() if dist.get_rank() == src else torch.empty_like(tensor)
    dist.broadcast(out, src=src)
    return out
