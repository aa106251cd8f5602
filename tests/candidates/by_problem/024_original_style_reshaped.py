"""024_original_style.py with one change: the loss is returned as float32 [1], not 0-dim as the
problem's. It must fail on that shape alone: shapes are judged exactly."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(gate_logits, num_experts, top_k=2, attention_mask=None):
    if isinstance(gate_logits, tuple):
        gate_logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = F.softmax(gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts
    dist.all_reduce(loss)
    return (loss / dist.get_world_size()).reshape(1)
