"""Problem 87 in float64 and without halos: all-gather the whole map, convolve it in float64 with zero
padding, keep this rank's rows, round once to bf16. Independent of the reference; must pass."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(x, weight, bias, stride=1, padding=1, group=None):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    bands = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(bands, x.contiguous(), group=group)
    full = torch.cat(bands, dim=2).double()
    out = F.conv2d(full, weight.double(), None if bias is None else bias.double(), stride, padding)
    h = x.shape[2]
    return out[:, :, rank * h : (rank + 1) * h].to(x.dtype).contiguous()
