"""Problem 32 without the exchange (a mutant that must fail): every token goes through this rank's own
adapted MLP, weighted by its two router probabilities, as if every expert were local."""

import torch
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
    x = hidden_states
    probs = torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1)
    weight = probs.topk(top_k, dim=-1).values.float().sum(dim=1, keepdim=True)
    g = gate_proj(x) + F.linear(F.linear(x, lora_gate_A), lora_gate_B)
    u = up_proj(x) + F.linear(F.linear(x, lora_up_A), lora_up_B)
    h = F.silu(g) * u
    y = down_proj(h) + F.linear(F.linear(h, lora_down_A), lora_down_B)
    return (weight * y.float()).to(x.dtype)
