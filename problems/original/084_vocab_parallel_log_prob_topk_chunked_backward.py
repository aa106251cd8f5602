"""The original benchmark's problem 84, exactly: the backward of problem 83 (its original variant).

As the original's input builder makes them (a seed per rank): problem 83's inputs, the same targets
(19 i + 5 + t) mod 256 with t drawn from 0 .. 255 per trial (the original's trial index), the same on
every rank, vocab_parallel_logits [B, S, 256 / W] bf16 (B = 2, S = 8 rounded up to a multiple of W,
at least W), standard normal plus 8 at each target this rank owns, and grad_output [B, S] bf16,
linspace(-1, 1, B S) in bf16, the same on every rank. Called as solution(vocab_parallel_logits,
target, grad_output, None, 10, 0.9, chunk_size), chunk_size as problem 83's. Chunk by chunk of
chunk_size B tokens: an all-to-all of the chunk's rows to a token split, the original's bf16
top-10/top-p filter, the float32 softmax p over the kept logits, each row's gradient
grad_output (onehot(target) - p) on the kept logits (0 elsewhere, the target's too where it is
filtered out), and an all-to-all back to the vocabulary split; every rank returns float32 [B, S,
256 / W]. Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the logits are
drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: most of it. In most rows top-p keeps the boosted target alone, and there
the gradient is exactly 0; rows that keep more are 0 to 3 of 16 at W = 2, and a zero output of the
right shape passes a trial where none of them has a gradient beyond the tolerance: 7 of 20 seeds at
W = 2 (computed in one process, 2026-11-26), so it fails a check of a few trials. Where a row keeps
more, the filter matters: the gradient of the whole row's softmax is off by more than the tolerance
in every one of the 20.
"""

import math

import torch
import torch.distributed as dist

ID = 84
NAME = "vocab_parallel_log_prob_topk_chunked_backward"
CATEGORY = "TP"
SOURCE = "NeMo-RL chunked distributed log-probability with top-k/top-p, backward"
SUMMARY = "Gradient of problem 83's original w.r.t. vocab-split bf16 logits [2, 8, 256/W]; f32, chunked."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing vocab (256)"
# seq: at least this, and at least W, rounded up to a multiple of W; boost: added at each target;
# chunk_parts: chunk_size is seq / chunk_parts rounded up to a multiple of W (at most seq)
SIZES = {
    "pkb": {
        "batch": 2,
        "seq": 8,
        "vocab": 256,
        "target_step": 19,
        "target_offset": 5,
        "boost": 8.0,
        "chunk_parts": 4,
    }
}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
TOP_K = 10
TOP_P = 0.9


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def seq_len(world_size, size):
    """The original's S: its minimum or W, rounded up to a multiple of W."""
    return _round_up(max(world_size, size["seq"]), world_size)


def chunk_size(world_size, size):
    """The original's chunk_size: S / 4 or W, rounded up to a multiple of W, at most S."""
    seq = seq_len(world_size, size)
    return min(seq, _round_up(max(world_size, seq // size["chunk_parts"]), world_size))


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["vocab"] % world_size:
        return f"vocab = {size['vocab']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: standard normal logits per rank, boosted at the targets this rank owns; its
    arithmetic targets, their trial offset drawn per trial (shared); grad_output its bf16 linspace;
    top_k 10, top_p 0.9, its chunk."""
    s, w = ctx.size, ctx.world_size
    batch, seq, vocab = s["batch"], seq_len(w, s), s["vocab"]
    v_local = vocab // w
    logits = ctx.randn(batch, seq, v_local)
    trial = ctx.randint(0, vocab, 1, shared=True)
    tokens = torch.arange(batch * seq, dtype=torch.int64, device=ctx.device)
    target = (tokens * s["target_step"] + s["target_offset"] + trial).remainder(vocab).view(batch, seq)
    ids = ctx.rank * v_local + torch.arange(v_local, dtype=torch.int64, device=ctx.device)
    owned = ids.view(1, 1, v_local) == target.unsqueeze(-1)
    logits = logits + owned.to(logits.dtype) * s["boost"]
    grad_output = torch.linspace(-1.0, 1.0, batch * seq, dtype=torch.bfloat16, device=ctx.device)
    return logits, target, grad_output.view(batch, seq), None, TOP_K, TOP_P, chunk_size(w, s)


def _kept(rows, top_k, top_p):
    """Which of each bf16 row's logits the original's filter keeps (None: all), decided as it decides,
    in bf16: the top k with ties at the k-th, then those whose ascending cumulative softmax exceeds
    1 - top_p, the largest always."""
    vocab = rows.shape[-1]
    need_k = top_k is not None and top_k > 0
    need_p = top_p is not None and top_p < 1.0
    if not need_k and not need_p:
        return None
    k = min(int(top_k), vocab) if need_k else vocab
    if not need_p:
        return rows >= rows.topk(k, dim=-1).values[:, -1:]
    ascending, order = rows.sort(dim=-1)
    in_top_k = ascending >= ascending[:, vocab - k : vocab - k + 1]
    ascending = ascending.masked_fill(~in_top_k, -math.inf)
    keep = ascending.softmax(dim=-1).cumsum(dim=-1) > 1 - top_p
    keep[:, -1] = True
    return torch.zeros_like(keep).scatter_(1, order, keep & in_top_k)


@torch.no_grad()
def solution(vocab_parallel_logits, target, grad_output, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    w, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    batch, seq, v_local = vocab_parallel_logits.shape
    tokens = batch * seq
    logits = vocab_parallel_logits.reshape(tokens, v_local)
    flat_target = target.reshape(tokens)
    flat_grad = grad_output.reshape(tokens)
    pieces = []
    step = batch * max(1, int(chunk_size))
    # one chunk at a time is the workload (its memory bound), as the original runs it
    for start in range(0, tokens, step):
        stop = min(tokens, start + step)
        per_rank = (stop - start) // w
        # the chunk's vocabulary split -> token split: its rows j*per_rank.. go to rank j
        received = logits.new_empty(w, per_rank, v_local)
        dist.all_to_all_single(received, logits[start:stop].contiguous(), group=tp_group)
        rows = received.permute(1, 0, 2).reshape(per_rank, w * v_local)

        keep = _kept(rows, top_k, top_p)
        x = rows.float() if keep is None else rows.float().masked_fill(~keep, -math.inf)
        first = start + rank * per_rank
        mine = flat_target[first : first + per_rank].unsqueeze(1)
        # d log p[target] / d x = onehot(target) - softmax, on the kept logits only
        grad = x.softmax(dim=-1).neg_()
        grad.scatter_add_(1, mine, torch.ones_like(mine, dtype=grad.dtype))
        grad.mul_(flat_grad[first : first + per_rank].unsqueeze(1))
        if keep is not None:
            grad.mul_(keep)

        # token split -> vocabulary split: column block j of every row goes to rank j
        send = grad.view(per_rank, w, v_local).transpose(0, 1).contiguous()
        back = torch.empty(stop - start, v_local, dtype=grad.dtype, device=grad.device)
        dist.all_to_all_single(back, send, group=tp_group)
        pieces.append(back)
    return torch.cat(pieces).view(batch, seq, v_local)


def traffic(ctx):
    """Per GPU, as for pkb's variant (problems/084): its share of each token's top-k values to the
    token's owner (top_k / W bf16 values from each other rank), then each token's cutoff (bf16) and
    log-sum-exp (float32) to every rank, which writes its own gradient columns; one round. Memory:
    read the logits once, write the float32 gradient once."""
    w = ctx.world_size
    tokens = ctx.size["batch"] * seq_len(w, ctx.size)
    elems = tokens * (ctx.size["vocab"] // w)
    return {
        "nvlink_bytes": (w - 1) / w * tokens * (TOP_K / w * 2 + 6),
        "hbm_bytes": elems * (ctx.dtype.itemsize + 4) + tokens * (8 + 2),
        "flops": 3 * elems,
        "rounds": 1,
    }
