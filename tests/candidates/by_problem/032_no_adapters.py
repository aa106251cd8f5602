"""Problem 32 without its adapters (a mutant that must fail): the exchange done right, by gathering
every rank's MLP, but the LoRA terms left out."""

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
    x = hidden_states.float()
    weights, experts = torch.softmax(F.linear(hidden_states, gate_weight, gate_bias), dim=-1).topk(
        top_k, dim=-1
    )
    out = torch.zeros_like(x)
    for q, (g, u, d) in enumerate(_gather_layers((gate_proj, up_proj, down_proj), w, group)):
        y = F.linear(F.silu(F.linear(x, *g)) * F.linear(x, *u), *d)
        out += (weights.float() * (experts // local == q)).sum(dim=1, keepdim=True) * y
    return out.to(hidden_states.dtype)


def _gather_layers(layers, w, group):
    """[(gate, up, down) of rank q, each as (weight, bias) in float32] for every rank q."""
    gathered = []
    for layer in layers:
        pair = []
        for p in (layer.weight, layer.bias):
            parts = [torch.empty_like(p.detach()) for _ in range(w)]
            dist.all_gather(parts, p.detach().contiguous(), group=group)
            pair.append([t.float() for t in parts])
        gathered.append(pair)
    return [tuple((gathered[i][0][q], gathered[i][1][q]) for i in range(3)) for q in range(w)]
