"""Problem 24 without the all-reduce: each rank returns its own tokens' loss. It must fail: the
inputs give every rank a loss more than 10% away from the mean over ranks."""

import torch


def solution(gate_logits, num_experts, top_k=2, attention_mask=None):
    probs = torch.softmax(gate_logits, dim=-1, dtype=torch.float32)
    selected = torch.topk(gate_logits, top_k, dim=-1).indices
    counts = (selected.unsqueeze(-1) == torch.arange(num_experts)).sum(dim=(0, 1)).to(torch.float32)
    return torch.dot(counts, probs.mean(dim=0)) * (num_experts / gate_logits.shape[0])
