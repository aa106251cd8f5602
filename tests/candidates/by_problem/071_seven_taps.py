"""Problem 71 with the 7-tap kernel: the alternative to the reference's in-place form, for comparing on
GPUs (docs/gpu-results.md). Halos as the reference (one all-gather of the chunk tails); the block convolved
with symmetric padding k-1 (output k-1 longer), its first L_local columns copied out contiguously, then
each chunk's first k-1 outputs recomputed from its halo. A correct solution."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def solution(x, weight, group=None):
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    b, d, seq_local = x.shape
    k = weight.shape[-1]
    halo, chunk = k - 1, seq_local // 2
    tails = x.view(b, d, 2, chunk)[..., chunk - halo :].permute(2, 0, 1, 3).contiguous()
    gathered = tails.new_empty(w * 2, b, d, halo)
    _all_gather(gathered, tails, group=group)
    gathered = gathered.view(w, 2, b, d, halo)
    before_first = gathered[rank - 1, 0] if rank > 0 else torch.zeros_like(tails[0])
    before_second = gathered[rank + 1, 1] if rank < w - 1 else tails[0]
    out = F.conv1d(x, weight, padding=halo, groups=d)[..., :seq_local].contiguous()
    for start, before in ((0, before_first), (chunk, before_second)):
        seam = torch.cat([before, x[..., start : start + halo]], dim=-1)
        out[..., start : start + halo] = F.conv1d(seam, weight, groups=d)
    return out
