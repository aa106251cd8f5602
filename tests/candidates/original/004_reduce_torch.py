import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor, dst: int = 0) -> torch.Tensor:
    if dist.get_rank() == dst:
        out = tensor.clone()
        dist.reduce(out, dst=dst, op=dist.ReduceOp.SUM)
        return out
    dist.reduce(tensor.clone(), dst=dst, op=dist.ReduceOp.SUM)
    return tensor  # a non-root rank returns its input
