"""An all-reduce (problem 1) written as NCCL code may be: the ranks' row counts gathered as 0-dim
tensors, and their rows gathered in a list of unequal sizes, then summed. gloo refuses both calls;
on CPU pkb runs them as NCCL does (harness/gloo_as_nccl.py)."""

import torch
import torch.distributed as dist


def solution(x):
    world, rank = dist.get_world_size(), dist.get_rank()
    # each rank sends a different share of its rows (rank r keeps r of them back) ...
    keep = min(rank, x.shape[0] - 1)
    mine = x[keep:]
    counts = torch.empty(world, dtype=torch.int64)
    dist.all_gather_into_tensor(counts, torch.tensor(mine.shape[0], dtype=torch.int64))  # 0-dim
    rows = [x.new_empty((int(n), *x.shape[1:])) for n in counts.tolist()]
    dist.all_gather(rows, mine.contiguous())  # unequal sizes
    # ... and the held-back rows go in a second, equal-sized gather, stacked [W, keep_max, cols]
    held = torch.zeros(world - 1, *x.shape[1:], dtype=x.dtype)
    held[:keep] = x[:keep]
    stacked = x.new_empty((world, world - 1, *x.shape[1:]))
    dist.all_gather_into_tensor(stacked, held)  # into [W, ...]
    out = torch.zeros_like(x, dtype=torch.float32)
    for r in range(world):
        k = min(r, x.shape[0] - 1)
        out[k:] += rows[r].float()
        out[:k] += stacked[r, :k].float()
    return out.to(x.dtype)
