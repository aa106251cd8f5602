"""Problem 54 in float64 without masks of blocks: an independent correct solution (the tolerance's basis).

Every rank all-gathers q, k and v, computes the whole causal attention in float64 with an explicit
global mask, and returns its own block rounded to bf16.
"""

import torch
import torch.distributed as dist


def solution(q, k, v, softmax_scale=None, causal=False, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    s_local, d = q.shape[1], q.shape[3]
    scale = softmax_scale if softmax_scale is not None else d**-0.5

    def whole(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts, dim=1).double().transpose(1, 2)  # [B, H, S, D]

    qq, kk, vv = whole(q), whole(k), whole(v)
    scores = qq @ kk.transpose(-1, -2) * scale
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vv  # [B, H, S, D]
    mine = out[:, :, rank * s_local : (rank + 1) * s_local].transpose(1, 2)
    return mine.to(q.dtype).contiguous()
