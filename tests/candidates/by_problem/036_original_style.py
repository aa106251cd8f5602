"""Problem 36 in the original benchmark's convention, the way VeOmni writes it: a list all-to-all that
scatters head_dim and gathers seq_dim, then the optional cut of the padding. Called as
solution(x, 1, 2, None, 0); it must pass unchanged."""

import torch
import torch.distributed as dist


def _all_to_all(x, scatter_dim, gather_dim, group):
    world_size = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.tensor_split(x, world_size, scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world_size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim).contiguous()


def solution(x, seq_dim, head_dim, group=None, unpadded_dim_size=0):
    x = _all_to_all(x, head_dim, seq_dim, group)
    world_size = dist.get_world_size(group)
    if unpadded_dim_size and unpadded_dim_size % world_size != 0:
        x = x.narrow(seq_dim, 0, unpadded_dim_size).contiguous()
    return x
