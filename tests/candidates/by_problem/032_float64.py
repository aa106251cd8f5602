"""Problem 32 by another schedule, in float64: every rank all-gathers the W adapted expert MLPs (the
traffic model's weight schedule) and applies to each of its tokens the MLP of each chosen expert's
owner, router included in float64. Its top-k sets are the reference's (the logits' ladder has no
near-tie), so it differs only by rounding: within the tolerance."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    hidden_states,
    gate_weight,
    gate_bias,
    gate_proj,
    up_proj,
    down_proj,
    lora_gate_A,
    lora_gate_B,
    lora_up_A,
    lora_up_B,
    lora_down_A,
    lora_down_B,
    num_experts,
    top_k,
    group=None,
):
    w = dist.get_world_size(group)
    local = num_experts // w
    x = hidden_states.reshape(-1, hidden_states.shape[-1]).double()
    probs = torch.softmax(F.linear(x, gate_weight.double(), gate_bias.double()), dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    mine = [
        gate_proj.weight,
        gate_proj.bias,
        up_proj.weight,
        up_proj.bias,
        down_proj.weight,
        down_proj.bias,
        lora_gate_A,
        lora_gate_B,
        lora_up_A,
        lora_up_B,
        lora_down_A,
        lora_down_B,
    ]
    every = []
    for p in mine:
        parts = [torch.empty_like(p.detach()) for _ in range(w)]
        dist.all_gather(parts, p.detach().contiguous(), group=group)
        every.append(parts)
    out = torch.zeros_like(x)
    for q in range(w):
        gw, gb, uw, ub, dw, db, ga, gb_, ua, ub_, da, db_ = (parts[q].double() for parts in every)
        g = F.linear(x, gw, gb) + x @ ga.T @ gb_.T
        u = F.linear(x, uw, ub) + x @ ua.T @ ub_.T
        h = F.silu(g) * u
        y = F.linear(h, dw, db) + h @ da.T @ db_.T
        out += (weights * (experts // local == q)).sum(dim=1, keepdim=True) * y
    return out.to(hidden_states.dtype).view_as(hidden_states)
