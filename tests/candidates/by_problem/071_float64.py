"""Problem 71 in float64 over the whole sequence: an independent correct solution (the tolerance's basis).

Every rank all-gathers every x, puts the 2W chunks back in global order, convolves the whole sequence
causally in float64 (explicit left zero padding) and returns its two chunks rounded to bf16.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(x, weight, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    chunk = x.shape[-1] // 2
    ordered = [None] * (2 * world)
    for r, part in enumerate(parts):
        ordered[r] = part[..., :chunk]
        ordered[2 * world - 1 - r] = part[..., chunk:]
    whole = torch.cat(ordered, dim=-1).double()
    k = weight.shape[-1]
    y = F.conv1d(F.pad(whole, (k - 1, 0)), weight.double(), groups=x.shape[1])
    mine = [y[..., rank * chunk : (rank + 1) * chunk], y[..., (2 * world - 1 - rank) * chunk :][..., :chunk]]
    return torch.cat(mine, dim=-1).to(x.dtype)
