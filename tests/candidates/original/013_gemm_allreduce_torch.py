import torch
import torch.distributed as dist


def solution(A_local: torch.Tensor, B_local: torch.Tensor) -> torch.Tensor:
    out = A_local @ B_local
    dist.all_reduce(out)
    return out
