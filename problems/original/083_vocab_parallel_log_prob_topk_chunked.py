"""The original benchmark's problem 83, exactly: problem 82 (its original variant) chunk by chunk.

As the original's input builder makes them (a seed per rank): as problem 82's, B = 2 sequences of S
= 8 tokens (S rounded up to a multiple of W, and at least W), a vocabulary of 256 split over the
ranks, vocab_parallel_logits [B, S, 256 / W] bf16, standard normal plus 8 (in bf16) at each token's
target id where this rank owns it, but token i's target is (19 i + 5 + t) mod 256, where the
original's t is the trial's index (0, 1, ...): here t is drawn from 0 .. 255 per trial, the same on
every rank; and chunk_size = S / 4 rounded up to a multiple of W, at least W and at most S (2 at W
= 2, 4 at W = 4, 8 at W = 8). Called as solution(vocab_parallel_logits, target, None, 10, 0.9,
chunk_size). Chunk by chunk of chunk_size B tokens, as problem 82 does for all of them: an
all-to-all of the chunk's rows to a token split, the original's bf16 top-10/top-p filter, the
float32 log-softmax at the targets, an all-gather; every rank returns float32 [B, S]. Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound; the logits are drawn from secret seeds
(pkb's, docs/variants.md).

What a solution could skip: most of it, as in problem 82. In most rows top-p keeps the boosted target
alone (log-probability exactly 0); rows that keep more are 0 to 3 of 16 at W = 2, and a zero output
of the right shape passes a trial where there are none: 7 of 20 seeds at W = 2 (computed in one
process, 2026-11-26), so it fails a check of a few trials. Where a row keeps more, the filter
matters: the log-softmax over the whole row is off by more than the tolerance in every one of the
20. The chunks only bound memory: the result does not depend on them.
"""

import math

import torch
import torch.distributed as dist

ID = 83
NAME = "vocab_parallel_log_prob_topk_chunked"
CATEGORY = "TP"
SOURCE = "NeMo-RL chunked distributed log-probability with top-k/top-p"
SUMMARY = "Problem 82's original in chunks of S/4 tokens (rounded to W): logits bf16 [2, 8, 256/W]."
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
    arithmetic targets, their trial offset drawn per trial (shared); top_k 10, top_p 0.9, its chunk."""
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
    return logits, target, None, TOP_K, TOP_P, chunk_size(w, s)


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
def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0, chunk_size=1):
    w, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    batch, seq, v_local = vocab_parallel_logits.shape
    tokens = batch * seq
    logits = vocab_parallel_logits.reshape(tokens, v_local)
    flat_target = target.reshape(tokens)
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
        mine = flat_target[first : first + per_rank]
        log_prob = x.log_softmax(dim=-1).gather(1, mine.unsqueeze(1)).squeeze(1)

        gathered = [torch.empty_like(log_prob) for _ in range(w)]
        dist.all_gather(gathered, log_prob, group=tp_group)
        pieces.extend(gathered)
    return torch.cat(pieces).view(batch, seq)


def traffic(ctx):
    """Per GPU, as for problem 82 (chunking changes no byte a solution must move): its share of each
    token's top-k values to the token's owner (top_k / W bf16 values from each other rank) and its
    tokens' float32 outputs to every other rank, in one round. Memory: read the logits and targets
    once, write the outputs."""
    w = ctx.world_size
    tokens = ctx.size["batch"] * seq_len(w, ctx.size)
    v_local = ctx.size["vocab"] // w
    return {
        "nvlink_bytes": (w - 1) / w * tokens * (TOP_K / w * 2 + 4),
        "hbm_bytes": tokens * v_local * ctx.dtype.itemsize + tokens * 8 + tokens * 4,
        "flops": 2 * tokens * v_local,
        "rounds": 1,
    }
