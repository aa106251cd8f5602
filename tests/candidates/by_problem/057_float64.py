"""Problem 57 by autograd, in float64 (our own code): all-gather q, k, v and dout over the CP group,
recompute the replica's whole attention forward in float64, backpropagate dout through it and keep
this rank's block of the gradients, then average them over the DP pair in float64. It ignores out and
softmax_lse (the forward it recomputes is theirs) and must pass."""

import torch
import torch.distributed as dist

_GROUPS = {}


def _groups():
    w, rank = dist.get_world_size(), dist.get_rank()
    n = w // 2
    if w not in _GROUPS:
        mine = {}
        for rep in range(2):
            g = dist.new_group(list(range(rep * n, (rep + 1) * n)))
            if rank // n == rep:
                mine["cp"] = g
        for c in range(n):
            g = dist.new_group([c, c + n])
            if rank % n == c:
                mine["dp"] = g
        _GROUPS[w] = mine
    return _GROUPS[w]


def _gather(t, group, n):
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=1).double()


def solution(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False):
    groups = _groups()
    cp, dp = groups["cp"], groups["dp"]
    n, c = dist.get_world_size(cp), dist.get_rank(cp)
    s_l = q.shape[1]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qa, ka, va = (_gather(t, cp, n).requires_grad_() for t in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", qa, ka) * scale
    if causal:
        s = n * s_l
        above = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), va)
    o.backward(_gather(dout, cp, n))
    rows = slice(c * s_l, (c + 1) * s_l)
    grads = torch.stack([t.grad[:, rows] for t in (qa, ka, va)])
    dist.all_reduce(grads, group=dp)
    grads = (grads / dist.get_world_size(dp)).to(q.dtype)
    return grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous()
