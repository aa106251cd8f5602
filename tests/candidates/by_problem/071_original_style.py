"""Problem 71 written as a file for the original benchmark would be (our own code): Savanna's zigzag
halo exchange and causal depthwise convolution, called with the original's (x, weight, None).

The last k-1 columns of both chunks; point-to-point: the first chunk's tail to rank r+1 and the
second's to rank r-1, the first chunk's halo from rank r-1 (zeros on rank 0) and the second's from
rank r+1 (on the last rank, its own first chunk's tail); each chunk with its halo prepended, convolved
without padding, the two results side by side. It must pass unchanged.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(x, weight, group=None):
    group = group or dist.group.WORLD
    ranks = dist.get_process_group_ranks(group)
    world, rank = len(ranks), dist.get_rank(group)
    k = weight.shape[-1]
    chunk = x.shape[-1] // 2
    first, second = x[..., :chunk], x[..., chunk:]
    tail_first = first[..., chunk - (k - 1) :].contiguous()
    tail_second = second[..., chunk - (k - 1) :].contiguous()
    reqs = []
    halo_first = halo_second = None
    if rank > 0:
        halo_first = torch.empty_like(tail_first)
        reqs.append(dist.irecv(halo_first, src=ranks[rank - 1], group=group))
        reqs.append(dist.isend(tail_second, dst=ranks[rank - 1], group=group))
    if rank < world - 1:
        halo_second = torch.empty_like(tail_second)
        reqs.append(dist.isend(tail_first, dst=ranks[rank + 1], group=group))
        reqs.append(dist.irecv(halo_second, src=ranks[rank + 1], group=group))
    for req in reqs:
        req.wait()
    if halo_first is None:
        halo_first = torch.zeros_like(tail_first)
    if halo_second is None:
        halo_second = tail_first
    out_first = F.conv1d(torch.cat([halo_first, first], dim=-1), weight, groups=x.shape[1])
    out_second = F.conv1d(torch.cat([halo_second, second], dim=-1), weight, groups=x.shape[1])
    return torch.cat([out_first, out_second], dim=-1)
