"""Problem 82 (vocab_parallel_log_prob_topk): exchange top-k candidates instead of whole rows.

The reference (NeMo-RL's algorithm) moves (W-1)/W of every rank's logits through an all-to-all so that
each rank holds full vocabulary rows, sorts those rows, and all-gathers the results. But the answer of
each token depends only on its top_k largest logits (the top-p set and the log-sum-exp are taken over
them) and on its target's logit, which is among them (a sampled token is in its kept set). So, per call:

1. each rank takes the top min(top_k, V_local) logits of every token in its vocabulary slice
   (`torch.topk`, one read of the logits, no sort of the rows, no float32 copy of them);
2. one all-gather of those candidates, values and global vocabulary ids packed as int32 pairs
   (8 bytes each: 2048 tokens x 50 candidates is 0.8 MB per rank at the `large` size, against the
   reference's 128 MiB all-to-all at W = 2);
3. every rank merges the W candidate lists of every token (`topk` of W x top_k values), applies top-p
   to the merged top_k in float32, and takes the log-sum-exp of the kept values and the target's value
   among them: it computes every token's output itself, so the reference's second collective (the
   all-gather of outputs) is gone.

The kept set is the one the problem defines: top_k by value, then tokens whose more likely mass is below
top_p. A target outside its kept set gets -inf, as the reference's. With top_k off (None or not in
(0, V)) no candidate list bounds the kept set, and the call falls back to the reference's algorithm.
Plain torch operations only: the same code runs on CPU (gloo) and CUDA (NCCL).

Predicted on 2 H200s: at `large` (2 x 1024 tokens, V = 131072) the reference spends several ms in the
sort of [1024, 131072] rows and a dozen float32 passes over them plus ~0.4 ms in the all-to-all, and
this version one top-k pass over 256 MiB of logits (~0.2-0.5 ms) and a few small kernels: 10x or more.
At `pkb` ([2, 8, V/W], microseconds of data) both are launch- and latency-bound: one collective instead
of two, and about as many small kernels, so about 1.1-1.5x. Measured: docs/gpu-results.md.
"""

import math

import torch
import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reference_path(logits, target, group, top_k, top_p):
    """The reference's algorithm, for calls that set no top_k (no candidate list bounds the kept set)."""
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    b, s, v_local = logits.shape
    n = b * s // w
    received = logits.new_empty(w, n, v_local)
    dist.all_to_all_single(received, logits.reshape(b * s, v_local), group=group)
    rows = received.permute(1, 0, 2).reshape(n, w * v_local).float()
    ordered = rows.sort(dim=-1, descending=True).values
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_p < 1.0:
        probs = torch.softmax(ordered, dim=-1)
        keep = probs.cumsum(-1).sub_(probs) < top_p
    lse = torch.logsumexp(ordered.masked_fill(~keep, -math.inf), dim=-1)
    cutoff = ordered.masked_fill(~keep, math.inf).amin(dim=-1)
    picked = rows.gather(1, target.reshape(-1)[rank * n : (rank + 1) * n].unsqueeze(1)).squeeze(1)
    out = torch.where(picked >= cutoff, picked - lse, -math.inf)
    everything = out.new_empty(b * s)
    _all_gather(everything, out, group=group)
    return everything.view(b, s)


def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0):
    b, s, v_local = vocab_parallel_logits.shape
    w, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    vocab = w * v_local
    if top_k is None or not 0 < top_k < vocab:
        return _reference_path(vocab_parallel_logits, target, tp_group, top_k, top_p)
    tokens = b * s
    k_local = min(top_k, v_local)

    # 1. local candidates, packed as (float32 bits, global id) int32 pairs for one collective
    values, ids = vocab_parallel_logits.reshape(tokens, v_local).topk(k_local, dim=-1)
    packed = torch.stack([values.float().view(torch.int32), (ids + rank * v_local).to(torch.int32)], dim=-1)

    # 2. everyone's candidates: [W, tokens, k_local, 2] (gathered along the first dimension)
    gathered = packed.new_empty(w * tokens, k_local, 2)
    _all_gather(gathered, packed, group=tp_group)
    candidates = gathered.view(w, tokens, k_local, 2).permute(1, 0, 2, 3).reshape(tokens, w * k_local, 2)
    cand_values = candidates[..., 0].contiguous().view(torch.float32)
    cand_ids = candidates[..., 1]

    # 3. the global top_k (descending), top-p over it, log-sum-exp of the kept, the target's value
    top_values, where = cand_values.topk(top_k, dim=-1)
    top_ids = cand_ids.gather(1, where)
    keep = torch.ones_like(top_values, dtype=torch.bool)
    if top_p < 1.0:
        probs = torch.softmax(top_values, dim=-1)
        keep = probs.cumsum(-1).sub_(probs) < top_p
    lse = torch.logsumexp(top_values.masked_fill(~keep, -math.inf), dim=-1)
    hit = (top_ids == target.reshape(tokens, 1).to(torch.int32)) & keep
    picked = top_values.masked_fill(~hit, 0.0).sum(dim=-1)
    out = torch.where(hit.any(dim=-1), picked - lse, -math.inf)
    return out.view(b, s)
