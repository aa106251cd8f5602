import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor) -> torch.Tensor:
    out = tensor.new_empty(tensor.shape[0] // dist.get_world_size(), *tensor.shape[1:])
    dist.reduce_scatter_tensor(out, tensor, op=dist.ReduceOp.SUM)
    return out
