"""Problem 84 by autograd in float64, without chunks: an independent correct solution (the tolerance's
basis). Every rank all-gathers the logits, filters in float64, differentiates the sum of
grad_output * log-probability with torch.autograd and returns its own vocabulary columns in float32.
"""

import torch
import torch.distributed as dist


def solution(vocab_parallel_logits, target, grad_output, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    world, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    parts = [torch.empty_like(vocab_parallel_logits) for _ in range(world)]
    dist.all_gather(parts, vocab_parallel_logits.contiguous(), group=tp_group)
    b, s, v_local = vocab_parallel_logits.shape
    x = torch.cat(parts, dim=-1).double().reshape(b * s, world * v_local).requires_grad_(True)
    with torch.no_grad():
        ordered = x.sort(dim=-1, descending=True).values
        if top_k is not None and 0 < top_k < ordered.shape[-1]:
            ordered = ordered[:, :top_k]
        keep_sorted = torch.ones_like(ordered, dtype=torch.bool)
        if top_p < 1.0:
            probs = torch.softmax(ordered, dim=-1)
            keep_sorted = probs.cumsum(-1) - probs < top_p
        cutoff = ordered.masked_fill(~keep_sorted, float("inf")).amin(dim=-1, keepdim=True)
        keep = x >= cutoff
    filtered = torch.where(keep, x, torch.full_like(x, float("-inf")))
    log_probs = torch.log_softmax(filtered, dim=-1).gather(1, target.reshape(-1, 1)).squeeze(1)
    (log_probs * grad_output.reshape(-1).double()).sum().backward()
    grad = x.grad.reshape(b, s, world * v_local)[..., rank * v_local : (rank + 1) * v_local]
    return grad.float().contiguous()
