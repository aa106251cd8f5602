"""Problem 82 in float64 by another schedule: an independent correct solution, used to measure how far
correct solutions lie from the float32 reference (the tolerance's basis).

Every rank all-gathers the whole logits, filters each row in float64 (top-k by value, top-p on the
descending exclusive cumulative mass) and returns every token's log-probability, rounded to float32.
"""

import math

import torch
import torch.distributed as dist


def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0):
    world = dist.get_world_size(tp_group)
    parts = [torch.empty_like(vocab_parallel_logits) for _ in range(world)]
    dist.all_gather(parts, vocab_parallel_logits.contiguous(), group=tp_group)
    x = torch.cat(parts, dim=-1).double()
    b, s, vocab = x.shape
    x = x.reshape(b * s, vocab)
    ordered = x.sort(dim=-1, descending=True).values
    if top_k is not None and 0 < top_k < vocab:
        ordered = ordered[:, :top_k]
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_p < 1.0:
        probs = torch.softmax(ordered, dim=-1)
        keep = probs.cumsum(-1) - probs < top_p
    lse = torch.logsumexp(ordered.masked_fill(~keep, -math.inf), dim=-1)
    cutoff = ordered.masked_fill(~keep, math.inf).amin(dim=-1)
    picked = x.gather(1, target.reshape(-1, 1)).squeeze(1)
    out = torch.where(picked >= cutoff, picked - lse, -math.inf)
    return out.float().view(b, s)
