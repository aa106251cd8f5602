"""Problem 56 by another schedule, in float64 (our own code): each stage all-gathers its layer input
over its CP group and projects every block locally, everything in float64, and stage 0 sends y0 in
float64. It differs from the reference by the bf16 roundings the reference makes and must pass."""

import torch
import torch.distributed as dist

_GROUPS = {}


def _groups():
    w, rank = dist.get_world_size(), dist.get_rank()
    n = w // 2
    if w not in _GROUPS:
        mine = {}
        for p in range(2):
            g = dist.new_group(list(range(p * n, (p + 1) * n)))
            if rank // n == p:
                mine["cp"] = g
        for c in range(n):
            g = dist.new_group([c, c + n])
            if rank % n == c:
                mine["pp"] = g
        _GROUPS[w] = mine
    return _GROUPS[w]


def _layer(x, w_qkv, w_o, heads, scale, causal, cp):
    n, c = dist.get_world_size(cp), dist.get_rank(cp)
    b, s_l = x.shape[:2]
    every = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(every, x.contiguous(), group=cp)
    d = w_qkv.shape[0] // (3 * heads)
    scale = scale if scale is not None else d**-0.5
    qkv = (torch.cat(every, dim=1) @ w_qkv.double().T).view(b, n * s_l, 3, heads, d)
    q = qkv[:, c * s_l : (c + 1) * s_l, 0].transpose(1, 2)
    k, v = qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        pos_q = torch.arange(c * s_l, (c + 1) * s_l, device=q.device).view(-1, 1)
        later = torch.arange(n * s_l, device=q.device).view(1, -1) > pos_q
        scores = scores.masked_fill(later, float("-inf"))
    ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s_l, heads * d)
    return ctx @ w_o.double().T


def solution(hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False):
    groups = _groups()
    stage = dist.get_rank(groups["pp"])
    peer = dist.get_process_group_ranks(groups["pp"])[1 - stage]
    if stage == 0:
        y = _layer(hidden_states.double(), w_qkv, w_o, num_heads, softmax_scale, causal, groups["cp"])
        dist.send(y, peer)
    else:
        x = torch.empty(hidden_states.shape, dtype=torch.float64, device=hidden_states.device)
        dist.recv(x, peer)
        y = _layer(x, w_qkv, w_o, num_heads, softmax_scale, causal, groups["cp"])
    return y.to(hidden_states.dtype)
