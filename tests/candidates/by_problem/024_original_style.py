"""Problem 24 in the original benchmark's convention, computed the way Transformers' Mixtral code does
(bf16 softmax, top-k of the probabilities, one-hot expert mask, means), then the scalar all-reduced
and averaged over the ranks. Called as solution(gate_logits, num_experts, 2, None). It returns a
0-dim tensor, as the original and the problem do, and passes: Transformers' own arithmetic (bf16
softmax and means) is within the tolerance (024_original_style_reshaped.py returns float32 [1] and
fails on that shape alone)."""

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
    return loss / dist.get_world_size()
