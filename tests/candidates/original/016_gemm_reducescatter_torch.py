import torch
import torch.distributed as dist


def solution(A_local: torch.Tensor, B_local: torch.Tensor) -> torch.Tensor:
    partial = A_local @ B_local
    out = partial.new_empty(partial.shape[0] // dist.get_world_size(), partial.shape[1])
    dist.reduce_scatter_tensor(out, partial)
    return out
