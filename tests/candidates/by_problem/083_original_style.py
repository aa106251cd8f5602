"""Problem 83 written as a file for the original benchmark would be (our own code): NeMo-RL's chunked
algorithm, called with the original's (logits, target, None, top_k, top_p, chunk_size).

Per chunk of chunk_size * B flattened tokens: all-to-all of lists to a token split, vLLM-style
top-k/top-p on the bf16 rows, float32 log-softmax, the targets' values, an all-gather of lists. It must
pass unchanged.
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


def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    group = tp_group or dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, s, v_local = vocab_parallel_logits.shape
    flat = vocab_parallel_logits.reshape(b * s, v_local)
    flat_target = target.flatten()
    step = chunk_size * b
    results = []
    for start in range(0, b * s, step):
        chunk = flat[start : start + step]
        n = chunk.shape[0] // world
        received = [torch.empty(n, v_local, dtype=chunk.dtype, device=chunk.device) for _ in range(world)]
        dist.all_to_all(received, [p.contiguous() for p in chunk.split(n, dim=0)], group=group)
        rows = torch.cat(received, dim=-1)
        log_probs = F.log_softmax(_filter(rows, top_k, top_p).float(), dim=-1)
        mine = flat_target[start : start + step][rank * n : (rank + 1) * n]
        picked = log_probs.gather(-1, mine.unsqueeze(-1)).squeeze(-1)
        parts = [torch.empty_like(picked) for _ in range(world)]
        dist.all_gather(parts, picked, group=group)
        results.append(torch.cat(parts))
    return torch.cat(results).view(b, s)
