"""Problem 37 in the original benchmark's convention, the way VeOmni writes it: pad seq_dim to a
multiple of the world size (never needed at these sizes), then a list all-to-all that scatters
seq_dim and gathers head_dim. Called as solution(x, 1, 2, None); it must pass unchanged."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _all_to_all(x, scatter_dim, gather_dim, group):
    world_size = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.tensor_split(x, world_size, scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world_size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim).contiguous()


def solution(x, seq_dim, head_dim, group=None):
    world_size = dist.get_world_size(group)
    dim = seq_dim % x.dim()
    extra = -x.shape[dim] % world_size
    if extra:
        x = F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, extra])
    return _all_to_all(x, seq_dim, head_dim, group)
