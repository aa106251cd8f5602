"""Problem 66 as GraphBolt's cooperative conversion writes its backward: sum the gradient rows per
unique seed with a sparse [seed_size, ids] matrix product, then send each rank its seeds' rows back
(all_to_all_single with split sizes: gloo's list all_to_all takes equal chunks only). Called as the
original harness calls it: (grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received,
None)."""

import torch
import torch.distributed as dist


def solution(
    grad_output: torch.Tensor,
    seed_inverse_ids: torch.Tensor,
    seed_size: int,
    counts_sent: list[int],
    counts_received: list[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    n = seed_inverse_ids.numel()
    index = torch.stack([seed_inverse_ids, torch.arange(n, device=grad_output.device)])
    values = torch.ones(n, dtype=grad_output.dtype, device=grad_output.device)
    summing = torch.sparse_coo_tensor(index, values, (seed_size, n))
    grad_seed = torch.sparse.mm(summing, grad_output)
    out = grad_output.new_empty((sum(counts_received), *grad_output.shape[1:]))
    dist.all_to_all_single(out, grad_seed.contiguous(), counts_received, counts_sent, group=group)
    return out
