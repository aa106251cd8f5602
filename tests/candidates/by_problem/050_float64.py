"""Problem 50 computed another way, in float64: all-gather every rank's expert MLP (no token moves),
route in float64 and run each expert on the tokens that chose it, here, weighting by the routing
probabilities. Independent of the reference's dispatch; it measures how far the bf16 reference is
from exact arithmetic, and must pass."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    w = dist.get_world_size(group)
    local = num_experts // w
    params = [p for m in (gate_proj, up_proj, down_proj) for p in (m.weight, m.bias)]
    mine = torch.cat([p.reshape(-1) for p in params])
    every = [torch.empty_like(mine) for _ in range(w)]
    dist.all_gather(every, mine, group=group)
    x = hidden_states.reshape(-1, hidden_states.shape[-1]).double()
    probs = torch.softmax(x @ gate_weight.double().T + gate_bias.double(), dim=-1)
    top, chosen = probs.topk(top_k, dim=-1)
    out = torch.zeros_like(x)
    for q, flat in enumerate(every):
        weights = (top * (chosen // local == q)).sum(dim=-1, keepdim=True)
        gw, gb, uw, ub, dw, db = (
            t.view(p.shape).double()
            for t, p in zip(flat.split([p.numel() for p in params]), params, strict=True)
        )
        out += weights * F.linear(F.silu(F.linear(x, gw, gb)) * F.linear(x, uw, ub), dw, db)
    return out.to(hidden_states.dtype)
