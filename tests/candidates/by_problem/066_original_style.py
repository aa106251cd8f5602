"""Problem 66 as GraphBolt's cooperative conversion writes its backward: send chunk i of the
gradient back to the rank i places on, receive chunk j from the rank j places on (one
all_to_all_single, its splits put in rank order: gloo's list all_to_all takes equal chunks only),
then sum the received rows per row with a sparse [seed_size, ids] matrix product. Called as the
original harness calls it: (grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received,
None)."""

import torch
import torch.distributed as dist


def _by_rank(chunks: list, rank: int) -> list:
    """Chunk i (for the rank i places on) at position (rank + i) % W."""
    world = len(chunks)
    return [chunks[(peer - rank) % world] for peer in range(world)]


def solution(
    grad_output: torch.Tensor,
    seed_inverse_ids: torch.Tensor,
    seed_size: int,
    counts_sent: list[int],
    counts_received: list[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    rank = dist.get_rank(group)
    send = torch.cat(_by_rank(list(grad_output.split(counts_sent)), rank))
    in_splits = _by_rank(counts_received, rank)
    received = grad_output.new_empty((sum(counts_received), *grad_output.shape[1:]))
    dist.all_to_all_single(received, send, in_splits, _by_rank(counts_sent, rank), group=group)
    by_offset = received.split(in_splits)
    ordered = torch.cat([by_offset[(rank + j) % len(in_splits)] for j in range(len(in_splits))])
    n = seed_inverse_ids.numel()
    index = torch.stack([seed_inverse_ids, torch.arange(n, device=grad_output.device)])
    values = torch.ones(n, dtype=grad_output.dtype, device=grad_output.device)
    summing = torch.sparse_coo_tensor(index, values, (seed_size, n))
    return torch.sparse.mm(summing, ordered)
