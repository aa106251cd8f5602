"""Problem 34 in the original benchmark's convention: all_gather into a list, then one cat. Called as
solution(x, None); it must pass unchanged."""

import torch
import torch.distributed as dist


def solution(x, group=None):
    world_size = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)
