"""Problem 1, correct, printing one line per rank: what a rank prints comes back in its result."""

import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    print(f"rank {dist.get_rank()} summed {out.numel()} values")
    return out
