"""Problem 26 in the original benchmark's convention, the way VeOmni's dispatcher preprocess goes:
count tokens per expert, derive this rank's send splits, all-gather the counts as a list, take this
rank's experts' columns, and move the results to the host. Called as
solution(expert_mask, num_experts, None). Host tensors are judged like device ones (values, dtypes,
shapes), so it passes unchanged (on a GPU it pays for the device-to-host copies)."""

import torch
import torch.distributed as dist


def solution(expert_mask, num_experts, group=None):
    ep_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    num_local_experts = num_experts // ep_size
    num_local_tokens_per_expert = expert_mask.sum(dim=(1, 2))
    input_splits = num_local_tokens_per_expert.reshape(ep_size, num_local_experts).sum(dim=1)
    parts = [torch.empty_like(num_local_tokens_per_expert) for _ in range(ep_size)]
    dist.all_gather(parts, num_local_tokens_per_expert, group=group)
    num_global_tokens_per_expert = torch.stack(parts).reshape(ep_size, num_experts)
    start = rank * num_local_experts
    num_global_tokens_per_local_expert = num_global_tokens_per_expert[:, start : start + num_local_experts]
    output_splits = num_global_tokens_per_local_expert.sum(dim=-1)
    num_global_sum_tokens_per_local_expert = num_global_tokens_per_local_expert.sum(dim=0)
    return (
        input_splits.to(torch.int64).to("cpu"),
        output_splits.to(torch.int64).to("cpu"),
        num_global_tokens_per_local_expert.contiguous().to("cpu"),
        num_global_sum_tokens_per_local_expert.to("cpu"),
    )
