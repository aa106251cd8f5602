# Problem 7 written the original benchmark's way: wrong. It returns its own row block without
# summing the other ranks' contributions.
import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor) -> torch.Tensor:
    rows = tensor.shape[0] // dist.get_world_size()
    start = dist.get_rank() * rows
    return tensor[start : start + rows].clone()
