"""Problem 51 without the exchange (a wrong solution): each rank runs only its own expert, on its own
tokens that chose it, and never sends a token. It must fail: the remote experts' outputs, about half
of every token's, are missing."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

_GROUPS = {}  # (world size, experts) -> this rank's EP group


def _ep_group(num_experts):
    """This rank's EP group of num_experts consecutive ranks; every group made once, on the first call."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if (world, num_experts) not in _GROUPS:
        for g in range(world // num_experts):
            group = dist.new_group(list(range(g * num_experts, (g + 1) * num_experts)))
            if rank // num_experts == g:
                _GROUPS[world, num_experts] = group
    return _GROUPS[world, num_experts]


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    group = group or _ep_group(num_experts)
    local = num_experts // dist.get_world_size(group)
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    probs, chosen = torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1).topk(top_k, dim=-1)
    weight = (probs * (chosen // local == dist.get_rank(group))).sum(dim=-1, keepdim=True)
    y = down_proj(F.silu(gate_proj(x)) * up_proj(x))
    return (y.float() * weight.float()).to(x.dtype)
