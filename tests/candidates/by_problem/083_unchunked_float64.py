"""Problem 83 without chunks, in float64: the same semantics as problem 82, by another schedule.

Ignores chunk_size: every rank all-gathers the whole logits and filters every row in float64. It must
pass: the chunked problem is judged against problem 82's result, not against a chunking.
"""

import math

import torch
import torch.distributed as dist


def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
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
