"""Problem 55 by another schedule, in float64 (our own code): all-gather the hidden states over the CP
group (not k and v) and project every block locally, attention and both projections in float64, the
TP partials summed in float64. It differs from the reference by the bf16 roundings the reference makes
(q, k, v, ctx, the TP partials) and must pass."""

import torch
import torch.distributed as dist

_GROUPS = {}


def _groups():
    w, rank = dist.get_world_size(), dist.get_rank()
    if w not in _GROUPS:
        mine = {}
        for c in range(w // 2):
            g = dist.new_group([2 * c, 2 * c + 1])
            if rank // 2 == c:
                mine["tp"] = g
        for t in range(2):
            g = dist.new_group(list(range(t, w, 2)))
            if rank % 2 == t:
                mine["cp"] = g
        _GROUPS[w] = mine
    return _GROUPS[w]


def solution(hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False):
    groups = _groups()
    cp, tp = groups["cp"], groups["tp"]
    n, c = dist.get_world_size(cp), dist.get_rank(cp)
    b, s_l = hidden_states.shape[:2]
    heads = num_heads // dist.get_world_size(tp)
    d = w_qkv.shape[0] // (3 * heads)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    every = [torch.empty_like(hidden_states) for _ in range(n)]
    dist.all_gather(every, hidden_states.contiguous(), group=cp)
    x = torch.cat(every, dim=1).double()  # [B, S, hidden]
    qkv = (x @ w_qkv.double().T).view(b, n * s_l, 3, heads, d)
    q = qkv[:, c * s_l : (c + 1) * s_l, 0].transpose(1, 2)  # [B, h, S_l, D]
    k, v = qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
    scores = q @ k.transpose(-1, -2) * scale  # [B, h, S_l, S]
    if causal:
        pos_q = torch.arange(c * s_l, (c + 1) * s_l, device=q.device).view(-1, 1)
        later = torch.arange(n * s_l, device=q.device).view(1, -1) > pos_q
        scores = scores.masked_fill(later, float("-inf"))
    ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s_l, heads * d)
    y = ctx @ w_o.double().T
    dist.all_reduce(y, group=tp)
    return y.to(hidden_states.dtype)
