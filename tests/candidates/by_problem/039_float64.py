"""Problem 39 computed another way, in float64: gather every rank's hidden states (one all-gather, no
all-to-all), project and attend over the whole sequence for all heads, keep this rank's positions.
Independent of the reference's Ulysses layout; it measures how far the bf16 reference is from exact
attention, and must pass."""

import math

import torch
import torch.distributed as dist


def solution(hidden_states, w_qkv, w_o, group=None, num_heads=8, causal=False):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    batch, seq_local, hidden = hidden_states.shape
    head_dim = hidden // num_heads
    parts = [torch.empty_like(hidden_states) for _ in range(world)]
    dist.all_gather(parts, hidden_states.contiguous(), group=group)
    h = torch.cat(parts, dim=1).double()  # [B, S, hidden]
    seq = h.shape[1]
    qkv = h @ w_qkv.double().T
    q, k, v = qkv.view(batch, seq, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    rows = slice(rank * seq_local, (rank + 1) * seq_local)
    scores = q[:, :, rows] @ k.transpose(-1, -2) / math.sqrt(head_dim)  # [B, H, s, S]
    if causal:
        pos_q = torch.arange(rank * seq_local, (rank + 1) * seq_local).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(seq).unsqueeze(0) > pos_q, -math.inf)
    o = torch.softmax(scores, dim=-1) @ v  # [B, H, s, D]
    o = o.permute(0, 2, 1, 3).reshape(batch, seq_local, hidden)
    return (o @ w_o.double().T).to(hidden_states.dtype)
