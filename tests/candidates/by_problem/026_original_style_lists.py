"""Problem 26 in the original benchmark's convention with the split sizes returned as Python lists
(what an all-to-all's split arguments take): it fails the contract, whose outputs are tensors."""

import torch
import torch.distributed as dist


def solution(expert_mask, num_experts, group=None):
    ep_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    local = num_experts // ep_size
    counts = expert_mask.sum(dim=(1, 2))
    parts = [torch.empty_like(counts) for _ in range(ep_size)]
    dist.all_gather(parts, counts, group=group)
    mine = torch.stack(parts)[:, rank * local : (rank + 1) * local]
    input_splits = counts.reshape(ep_size, local).sum(dim=1).to(torch.int64).tolist()
    output_splits = mine.sum(dim=-1).to(torch.int64).tolist()
    return input_splits, output_splits, mine.contiguous(), mine.sum(dim=0)
