"""Problem 33 in the original benchmark's convention, written the way VeOmni writes it: split x into
W chunks along scatter_dim, exchange the list with all_to_all, concatenate along gather_dim. Called
as solution(x, 0, 1, None); it must pass unchanged."""

import torch
import torch.distributed as dist


def solution(x, scatter_dim, gather_dim, group=None):
    world_size = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.tensor_split(x, world_size, scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world_size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim).contiguous()
