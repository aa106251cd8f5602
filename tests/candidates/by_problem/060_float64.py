"""Problem 60 in float64 by another road: all-gather the half spectrum, torch.fft.irfft2 of the
whole of it, keep this rank's columns (a check of the reference's tolerance, not a fast solution)."""

import torch
import torch.distributed as dist


@torch.no_grad()
def solution(x, s, dim, norm="ortho", group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    every = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(every, x, group=group)
    whole = torch.cat(every, dim=dim[0]).to(torch.complex128)
    field = torch.fft.irfft2(whole, s=tuple(s), dim=tuple(dim), norm=norm)
    return field.chunk(world, dim=dim[1])[rank].to(torch.float32).contiguous()
