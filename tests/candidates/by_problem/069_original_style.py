"""Problem 69 written plainly in the original's convention: probabilities by float32 sigmoid, each
positive's rank by counting the negatives scored at least as high, the uneven lists exchanged by
all-gathering the counts and the lists padded to the longest (an all-reduce finds it). Called as the
original harness calls it: (local_pos_scores, local_neg_scores, None). SIGMOID_DTYPE = torch.bfloat16
rounds the probabilities to bf16 first, which merges neighbouring logits and must fail."""

import torch
import torch.distributed as dist

SIGMOID_DTYPE = torch.float32


def solution(
    local_pos_scores: torch.Tensor,
    local_neg_scores: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    world = dist.get_world_size(group)
    pos = torch.sigmoid(local_pos_scores.to(SIGMOID_DTYPE))
    neg = torch.sigmoid(local_neg_scores.to(SIGMOID_DTYPE))
    ranks = 1 + (neg >= pos[:, None]).to(torch.int64).sum(dim=1)
    n = torch.tensor([ranks.numel()], dtype=torch.int64, device=ranks.device)
    longest = n.clone()
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    sizes = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    padded = torch.zeros(int(longest.item()), dtype=torch.int64, device=ranks.device)
    padded[: ranks.numel()] = ranks
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[: int(size.item())] for part, size in zip(parts, sizes, strict=True)])
