# right values, by the original's rules: but it all-reduces its input in place and returns it
import torch
import torch.distributed as dist


@torch.no_grad()
def solution(tensor):
    dist.all_reduce(tensor)
    return tensor
