"""Problem 82 written as a file for the original benchmark would be (our own code): NeMo-RL's algorithm as
the library runs it, called with the original's (logits, target, None, top_k, top_p).

All-to-all from the vocabulary split to a token split, vLLM-style top-k/top-p on the bf16 rows (sort
ascending, softmax and cumulative sum in bf16, keep where the sum exceeds 1 - top_p), float32
log-softmax over the filtered rows, the targets' values, an all-gather of lists. It must pass unchanged:
the inputs leave no ties or near-threshold sums for its bf16 filter to decide differently.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _filter(logits, top_k, top_p):
    ascending, order = logits.sort(dim=-1)
    if top_k is not None and top_k > 0:
        index = torch.full(ascending.shape[:-1], ascending.shape[-1] - top_k, device=logits.device)
        threshold = ascending.gather(-1, index.unsqueeze(-1))
        ascending = ascending.masked_fill(ascending < threshold, float("-inf"))
    if top_p < 1.0:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[..., -1] = False
        ascending = ascending.masked_fill(drop, float("-inf"))
    return ascending.scatter(-1, order, ascending)


def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0):
    group = tp_group or dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, s, v_local = vocab_parallel_logits.shape
    n = b * s // world
    flat = vocab_parallel_logits.reshape(b * s, v_local)
    pieces = list(flat.split(n, dim=0))
    received = [torch.empty_like(pieces[0]) for _ in range(world)]
    dist.all_to_all(received, [p.contiguous() for p in pieces], group=group)
    rows = torch.cat(received, dim=-1)
    filtered = _filter(rows, top_k, top_p)
    log_probs = F.log_softmax(filtered.float(), dim=-1)
    mine = target.flatten()[rank * n : (rank + 1) * n]
    picked = log_probs.gather(-1, mine.unsqueeze(-1)).squeeze(-1)
    parts = [torch.empty_like(picked) for _ in range(world)]
    dist.all_gather(parts, picked, group=group)
    return torch.cat(parts).view(b, s)
