import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    if dist.get_rank() == src:
        out = torch.empty_like(tensor[0])
        dist.scatter(out, scatter_list=list(tensor.unbind(0)), src=src)
        return out
    dist.scatter(tensor, scatter_list=None, src=src)  # the others receive into the buffer they are given
    return tensor
