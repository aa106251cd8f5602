"""Backward of problem 83: the gradient of top-k/top-p log-probabilities w.r.t. vocab-split logits.

The backward pass of NeMo-RL's chunked distributed log-probability with top-k/top-p filters (problems 82
and 83 are its forward; read problem 82's docstring for the filter's rule and the inputs). Rank r holds
vocabulary ids r*V_local .. (r+1)*V_local - 1 of every token's logits, bf16 [B, S, V_local]; every rank
holds the targets int64 [B, S] and the upstream gradient grad_output bf16 [B, S] (the same on every
rank). With out[t] = x[target] - log(sum over kept of exp(x)) as in problem 82, every rank must return
the gradient for its own vocabulary slice, float32 [B, S, V_local]:

  grad[t, v] = grad_output[t] * ([v == target[t]] - softmax_kept(x[t])[v])   for kept v,
  grad[t, v] = 0                                                             for filtered-out v,

where softmax_kept is the float32 softmax over the kept set (zero outside it). The filter itself is
not differentiated (its mask is piecewise constant). The reference recomputes the forward chunk by chunk
as NeMo-RL does: per chunk of chunk_size * B tokens, an all-to-all of the logits to a token split, the
filter and the float32 softmax on full rows, the gradient rows, and an all-to-all back to the vocabulary
split, written straight into the result. As in problem 83, the chunks only bound memory: the result does
not depend on them.

Inputs: as problem 82's (no ties at either cutoff, cumulative probabilities at least 0.02 from 1 - top_p,
targets in their kept sets), plus grad_output and chunk_size. Outputs are non-zero only at the kept
tokens (1 to 9 per token), O(1) there.

Source: NeMo-RL `ChunkedDistributedLogprobWithSampling.backward` (ParallelKernelBench problem 84). The
signature and the call (logits, target, grad_output, None, top_k, top_p, chunk_size) are the original's.

Differences from the original: as problem 82's (inputs drawn so that the cutoffs are unambiguous and the
targets lie in their kept sets); `large` runs 4 chunks. chunk_size is the size's (8 at `pkb`) at
every world size, where the original's follows W (2, 4, 8 at W = 2, 4, 8: the `original` variant's);
the result does not depend on it, only the memory a chunk holds.
"""

import math

import torch
import torch.distributed as dist

ID = 84
NAME = "vocab_parallel_log_prob_topk_chunked_backward"
CATEGORY = "TP"
SOURCE = "NeMo-RL chunked distributed log-probability with top-k/top-p, backward"
SUMMARY = "Gradient of top-k/top-p log-probs w.r.t. vocab-split bf16 logits, in chunks; f32 [B, S, V/W]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing vocab, batch * seq and chunk_size * batch"
SIZES = {
    # batch, seq: tokens; vocab: the whole vocabulary, split evenly across ranks; chunk_size: sequence
    # positions per chunk (chunk_size * batch tokens)
    "pkb": {"batch": 2, "seq": 8, "vocab": 256, "chunk_size": 8},
    # problem 83's `large`; the reference also writes a float32 gradient of 512 MiB per rank at W = 2
    # (several ms on 2 H200s, an estimate until measured)
    "large": {"batch": 2, "seq": 1024, "vocab": 131072, "chunk_size": 256},
}
# Why the exchange cannot be a material part of the floor (docs/problem-format.md, MINOR_EXCHANGE;
# figures at the datasheet's ceilings, bench/scripts/comm_share.py)
MINOR_EXCHANGE = (
    "the exchange is, per token, its top_k / W largest logits to the token's owner and the cutoff and "
    "log-sum-exp back, about 12 bytes, against the V / W logits read and their float32 gradient "
    "written (6 bytes each): at W = 4 the bytes take about 60 / V of the HBM term (0.04% at `large`), "
    "and the one round's 5 us is 0.5% of a 1 ms floor"
)
TOP_K = 10
TOP_P = 0.9
# Gradients are O(1) at the kept tokens and exactly 0 elsewhere. Correct solutions keep the same sets
# and differ in float32 rounding of the softmax: measured on CPU (W = 2, 4; 3 trials each), a float64
# autograd solution and a NeMo-style one differ by at most 2.4e-7 (relative norm 2e-7). A softmax in
# bf16 is off by ~1e-3 and fails.
TOLERANCE = {"atol": 1e-5, "rtol": 1e-4, "rel_norm": 1e-5}

# Head construction (make_inputs): how far the ascending cumulative probabilities stay from 1 - top_p.
TOP_P_MARGIN = 0.02
TAIL_GAP = 0.25  # the tail's largest logit is at least this far below the head's smallest (before rounding)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["vocab"] % world_size:
        return f"vocab = {size['vocab']} is not divisible by the world size {world_size}"
    if (size["batch"] * size["seq"]) % world_size:
        return f"batch * seq = {size['batch'] * size['seq']} is not divisible by the world size {world_size}"
    if (size["chunk_size"] * size["batch"]) % world_size:
        chunk = size["chunk_size"] * size["batch"]
        return f"chunk_size * batch = {chunk} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any batch, chunks of
    a multiple of W positions (split over the ranks) in sequences of 1 to 4 of them, vocabularies of 16 W."""
    chunk = draw("chunk_size", world_size, 4 * world_size, world_size)
    return {
        "batch": draw("batch", 1, 4),
        "seq": chunk * draw("chunks", 1, 4),
        "vocab": draw("vocab", 128, 1024, 16 * world_size),
        "chunk_size": chunk,
    }


def _draw_head(ctx, tokens, top_k, top_p):
    """Every token's top_k head logits (bf16), which of them top-p keeps, shared by all ranks.

    Probabilities first: a rest mass R in [0.02, 0.07) spread over top_k - m tokens, and m nucleus
    tokens of at least 1 - top_p + margin + 0.01 - R each, so that the ascending cumulative sums
    jump from R (< 1 - top_p - margin) to above 1 - top_p + margin at the nucleus; logits are their
    logarithms shifted so the largest is in [2, 5) (bf16 rounding then moves a probability by < 2%).
    Each token is checked after rounding (float64) and redrawn until it has the margins.
    """
    f64 = torch.float64
    lo, hi = 1.0 - top_p - TOP_P_MARGIN, 1.0 - top_p + TOP_P_MARGIN
    values = torch.empty(tokens, top_k, dtype=torch.bfloat16, device=ctx.device)
    kept = torch.zeros(tokens, top_k, dtype=torch.bool, device=ctx.device)
    todo = torch.ones(tokens, dtype=torch.bool, device=ctx.device)
    slot = torch.arange(top_k, dtype=f64, device=ctx.device)
    for _ in range(64):
        rest = ctx.rand(tokens, 1, low=0.02, high=0.07, dtype=f64, shared=True)
        floor = hi + 0.01 - rest  # the smallest nucleus probability
        m_max = (0.95 * (1.0 - rest) / floor).floor().clamp(1, max(1, min(16, top_k - 1)))
        m = (ctx.rand(tokens, 1, dtype=f64, shared=True) * m_max).floor() + 1
        nucleus = slot < m
        e = -torch.log1p(-ctx.rand(tokens, top_k, dtype=f64, shared=True))
        d_nuc = torch.where(nucleus, e, 0.0)
        d_nuc = d_nuc / d_nuc.sum(1, keepdim=True)
        d_rest = torch.where(nucleus, 0.0, 0.5 + e)
        d_rest = d_rest / d_rest.sum(1, keepdim=True).clamp_min(1e-30)
        probs = torch.where(nucleus, floor + (1.0 - rest - m * floor) * d_nuc, rest * d_rest)
        logits = probs.log()
        top = ctx.rand(tokens, 1, low=2.0, high=5.0, dtype=f64, shared=True)
        cand = (logits - logits.amax(1, keepdim=True) + top).to(torch.bfloat16)

        # the filter's decision on the rounded values, and whether it has the margins
        ascending, order = cand.to(f64).sort(1)
        cum = torch.softmax(ascending, 1).cumsum(1)
        keep_sorted = cum > 1.0 - top_p
        keep_sorted[:, -1] = True
        n_keep = keep_sorted.sum(1, keepdim=True)
        first = (top_k - n_keep).clamp_min(1)
        tie = (n_keep < top_k) & (ascending.gather(1, first) <= ascending.gather(1, first - 1))
        ok = ~(((cum > lo) & (cum < hi)).any(1, keepdim=True) | tie)
        take = (todo.unsqueeze(1) & ok).squeeze(1)
        values[take] = cand[take]
        kept[take] = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)[take]
        todo &= ~take
        if not bool(todo.any()):
            return values, kept
    raise RuntimeError("could not draw logits with unambiguous top-k/top-p cutoffs")


def make_inputs(ctx):
    """The original's call: logits, targets, grad_output, None, top_k, top_p, chunk_size.

    The head (values, which are kept, their vocabulary ids), the targets and the upstream gradient
    (standard normal, bf16, the same on every rank as the loss's gradient is) come from the shared
    generator; each rank draws its own tail below the head and writes the head ids it owns into it.
    Head ids are one per block of V // top_k ids, at a random offset, in a random order.
    """
    batch, seq, vocab = ctx.size["batch"], ctx.size["seq"], ctx.size["vocab"]
    w, rank = ctx.world_size, ctx.rank
    tokens, v_local = batch * seq, vocab // w
    if ctx.is_meta:
        target = ctx.randint(0, vocab, batch, seq, shared=True)
        grad = ctx.randn(batch, seq, shared=True)
        return ctx.randn(batch, seq, v_local), target, grad, None, TOP_K, TOP_P, ctx.size["chunk_size"]
    values, kept = _draw_head(ctx, tokens, TOP_K, TOP_P)
    block = vocab // TOP_K
    order = ctx.rand(tokens, TOP_K, dtype=torch.float32, shared=True).argsort(1)
    offset = ctx.randint(0, block, tokens, TOP_K, shared=True)
    ids = order * block + offset  # [tokens, top_k], distinct per token

    # the target: uniform over the kept slots
    u = ctx.rand(tokens, 1, dtype=torch.float64, shared=True)
    pick = (u * kept.sum(1, keepdim=True)).floor().long()
    slot = (kept.cumsum(1) <= pick).sum(1, keepdim=True)
    target = ids.gather(1, slot).view(batch, seq)

    floor = values.float().amin(1, keepdim=True)
    u_tail = ctx.rand(tokens, v_local, dtype=torch.float32)
    tail = floor - TAIL_GAP + torch.log1p(-u_tail)  # exponential below floor - gap
    local = ids - rank * v_local
    mine = (local >= 0) & (local < v_local)
    logits = torch.cat([tail, tail.new_empty(tokens, 1)], dim=1)  # column v_local: ids not owned here
    logits.scatter_(1, torch.where(mine, local, v_local), values.float())
    logits = logits[:, :v_local].to(torch.bfloat16).view(batch, seq, v_local)
    grad_output = ctx.randn(batch, seq, shared=True)
    return logits, target, grad_output, None, TOP_K, TOP_P, ctx.size["chunk_size"]


def _kept_softmax(rows, top_k, top_p):
    """float32 softmax over each row's kept set (zero elsewhere) and the kept mask, for bf16 rows [n, V]."""
    vocab = rows.shape[-1]
    x = rows.float()
    ordered = rows.sort(dim=-1, descending=True).values.float()
    n_keep = torch.full((rows.shape[0], 1), vocab, dtype=torch.long, device=rows.device)
    if top_k is not None and 0 < top_k < vocab:
        ordered = ordered[:, :top_k]
        n_keep.fill_(top_k)
    if top_p < 1.0:
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(dim=-1).sub_(probs)  # mass of the more likely tokens
        n_keep = (before < top_p).sum(dim=-1, keepdim=True)
    cutoff = ordered.gather(1, n_keep - 1)  # the smallest kept logit
    shown = torch.where(torch.arange(ordered.shape[1], device=rows.device) < n_keep, ordered, -math.inf)
    lse = torch.logsumexp(shown, dim=-1, keepdim=True)
    kept = x >= cutoff
    return x.sub_(lse).exp_().mul_(kept), kept


def solution(vocab_parallel_logits, target, grad_output, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    w = dist.get_world_size(tp_group)
    rank = dist.get_rank(tp_group)
    batch, seq, v_local = vocab_parallel_logits.shape
    tokens = batch * seq
    logits = vocab_parallel_logits.reshape(tokens, v_local)
    flat_target = target.reshape(tokens)
    flat_grad = grad_output.reshape(tokens)
    out = torch.empty(tokens, v_local, dtype=torch.float32, device=logits.device)
    step = chunk_size * batch
    # one chunk at a time is the workload (its memory bound), not a loop a tensor op could replace
    for start in range(0, tokens, step):
        stop = min(tokens, start + step)
        per_rank = (stop - start) // w
        received = logits.new_empty(w, per_rank, v_local)
        dist.all_to_all_single(received, logits[start:stop], group=tp_group)
        rows = received.permute(1, 0, 2).reshape(per_rank, w * v_local)
        first = start + rank * per_rank
        mine = flat_target[first : first + per_rank].unsqueeze(1)
        # d out / d x = onehot(target) - softmax_kept, on the kept set only
        soft, kept = _kept_softmax(rows, top_k, top_p)
        grad = soft.neg_().scatter_add_(1, mine, kept.gather(1, mine).float())
        grad.mul_(flat_grad[first : first + per_rank].float().unsqueeze(1))
        # token split -> vocabulary split: column block j of every row goes to rank j, and what arrives
        # is the chunk's rows in order, this rank's columns
        send = grad.view(per_rank, w, v_local).transpose(0, 1).contiguous()
        dist.all_to_all_single(out[start:stop], send, group=tp_group)
    return out.view(batch, seq, v_local)


def traffic(ctx):
    """Per GPU: its share of each token's top-k values to the token's owner, and per token the kept
    set's cutoff and log-sum-exp back to every rank, which then writes its own gradient columns.

    The kept set and its normalizer depend on each token's top_k largest logits: at least the top_k / W
    values (bf16) that each other rank holds of a token must reach the rank that computes them; every
    rank then needs each token's cutoff (bf16) and log-sum-exp (float32), 6 bytes, to write
    grad = g * ([v == target] - exp(x - lse)) on its kept columns (grad_output and the targets are on
    every rank already). The reference's two all-to-alls move (W-1)/W of the logits and of the float32
    gradient. The latency term counts one round; bytes and rounds are each a lower bound.
    Memory: read the logits once, write the float32 gradient once.
    """
    w = ctx.world_size
    tokens = ctx.size["batch"] * ctx.size["seq"]
    v_local = ctx.size["vocab"] // w
    elems = tokens * v_local
    return {
        "nvlink_bytes": (w - 1) / w * tokens * (TOP_K / w * 2 + 6),
        "hbm_bytes": elems * (ctx.dtype.itemsize + 4) + tokens * (8 + 2),
        "flops": 3 * elems,  # select the top k, compare with the cutoff, write (exp on the kept only)
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(vocab_parallel_logits, target, grad_output, tp_group=None, top_k=None, top_p=1.0, "
        "chunk_size=1)"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "as problem 82's (inputs drawn so that the cutoffs are unambiguous and the targets lie in their "
        "kept sets); `large` runs 4 chunks; chunk_size is the size's at every world size (the original's "
        "follows W), which the result does not depend on."
    ),
}
