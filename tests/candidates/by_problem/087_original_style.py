"""Problem 87 written plainly in the original's convention: every rank all-gathers the first and last
rows of every band, takes its neighbours' rows (zeros at the map's edges), pads its band with them
and convolves with padding on the width only. Called as the original harness calls it:
(x, weight, bias, 1, padding, None)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int = 1,
    padding: int = 1,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    edges = torch.cat([x[:, :, :padding], x[:, :, -padding:]], dim=2).contiguous()
    gathered = [torch.empty_like(edges) for _ in range(world)]
    dist.all_gather(gathered, edges, group=group)
    zeros = torch.zeros_like(edges[:, :, :padding])
    top = gathered[rank - 1][:, :, padding:] if rank > 0 else zeros
    bottom = gathered[rank + 1][:, :, :padding] if rank < world - 1 else zeros
    band = torch.cat([top, x, bottom], dim=2)
    return F.conv2d(band, weight, bias, stride=stride, padding=(0, padding))
