"""Problem 35 in the original benchmark's convention, the way VeOmni's variable all-gather goes: gather
every rank's length along gather_dim, pad to the longest, all-gather the padded tensors as a list,
cut each back to its length and concatenate. Called as solution(x, 0, None); it must pass unchanged."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(x, gather_dim, group=None):
    world_size = dist.get_world_size(group)
    dim = gather_dim % x.dim()
    size = torch.tensor([x.shape[dim]], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    longest = max(lengths)
    # F.pad lists (before, after) pairs from the last dimension backwards
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, longest - x.shape[dim]]
    padded = F.pad(x, pad).contiguous()
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, lengths, strict=True)], dim=dim)
