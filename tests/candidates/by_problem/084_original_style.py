"""Problem 84 written as a file for the original benchmark would be (our own code): NeMo-RL's chunked
backward, called with the original's (logits, target, grad_output, None, top_k, top_p, chunk_size).

Per chunk: all-to-all of lists to a token split, vLLM-style top-k/top-p on the bf16 rows (with its keep
mask), float32 softmax of the filtered rows, (one_hot(target) - softmax) * grad masked by the keep mask,
all-to-all of lists back to the vocabulary split, concatenated. It must pass unchanged.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _filter(logits, top_k, top_p):
    ascending, order = logits.sort(dim=-1)
    keep = torch.ones_like(ascending, dtype=torch.bool)
    if top_k is not None and top_k > 0:
        index = torch.full(ascending.shape[:-1], ascending.shape[-1] - top_k, device=logits.device)
        keep &= ascending >= ascending.gather(-1, index.unsqueeze(-1))
        ascending = ascending.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        above = cumulative > 1 - top_p
        above[..., -1] = True
        keep &= above
        ascending = ascending.masked_fill(~above, float("-inf"))
    return ascending.scatter(-1, order, ascending), keep.scatter(-1, order, keep)


def solution(vocab_parallel_logits, target, grad_output, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    group = tp_group or dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, s, v_local = vocab_parallel_logits.shape
    flat = vocab_parallel_logits.reshape(b * s, v_local)
    flat_target = target.flatten()
    flat_grad = grad_output.flatten()
    step = chunk_size * b
    chunks = []
    for start in range(0, b * s, step):
        chunk = flat[start : start + step]
        n = chunk.shape[0] // world
        received = [torch.empty(n, v_local, dtype=chunk.dtype, device=chunk.device) for _ in range(world)]
        dist.all_to_all(received, [p.contiguous() for p in chunk.split(n, dim=0)], group=group)
        rows = torch.cat(received, dim=-1)
        filtered, keep = _filter(rows, top_k, top_p)
        softmax = F.log_softmax(filtered.float(), dim=-1).exp()
        mine = flat_target[start : start + step][rank * n : (rank + 1) * n]
        g = flat_grad[start : start + step][rank * n : (rank + 1) * n]
        chosen = F.one_hot(mine, num_classes=rows.shape[-1]).float()
        grad = (chosen - softmax) * g.unsqueeze(-1) * keep
        pieces = [p.contiguous() for p in grad.split(v_local, dim=-1)]
        back = [torch.empty(n, v_local, dtype=grad.dtype, device=grad.device) for _ in range(world)]
        dist.all_to_all(back, pieces, group=group)
        chunks.append(torch.cat(back, dim=0))
    return torch.cat(chunks, dim=0).view(b, s, v_local)
