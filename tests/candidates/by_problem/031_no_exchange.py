"""Problem 31 without the exchange (a mutant that must fail): every token goes through this rank's own
MLP, weighted by its two router probabilities, as if every expert were local."""

import torch
import torch.nn.functional as F


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    probs = torch.softmax(F.linear(hidden_states, gate_weight, gate_bias), dim=-1)
    weight = probs.topk(top_k, dim=-1).values.float().sum(dim=1, keepdim=True)
    y = down_proj(F.silu(gate_proj(hidden_states)) * up_proj(hidden_states))
    return (weight * y.float()).to(hidden_states.dtype)
