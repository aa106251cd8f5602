"""The original benchmark's problem 82, exactly: NeMo-RL's log-probability under top-k/top-p, vocab split.

As the original's input builder makes them (a seed per rank): B = 2 sequences of S = 8 tokens (S
rounded up to a multiple of W, and at least W: 8 at W = 2, 4, 8; 16 at W = 16), a vocabulary of 256
split over the ranks. Every rank holds the same targets, target [B, S] int64, token i's target (17 i
+ 3 + t) mod 256, where the original's t is the trial's index (0, 1, ...): here t is drawn from 0 ..
255 per trial, the same on every rank. Rank r holds vocabulary ids r 256 / W .. (r+1) 256 / W - 1:
vocab_parallel_logits [B, S, 256 / W] bf16, standard normal, plus 8 (in bf16) at each token's target
id where this rank owns it. Called as solution(vocab_parallel_logits, target, None, 10, 0.9). An
all-to-all gives each rank B S / W tokens' whole rows; the filter runs on the bf16 rows as the
original's does: the top 10 (ties at the 10th kept), then top-p, the rows sorted ascending and every
logit kept whose bf16 softmax's cumulative sum (bf16) exceeds 1 - 0.9, the largest always; each
row's float32 log-softmax over the kept logits is taken at its target, and an all-gather gives every
rank every token's: float32 [B, S]. Judged as the original harness judges: atol = rtol = 1e-2, no
norm bound; the logits are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: most of it. The boost of 8 makes each target its row's largest logit
by far, so in most rows top-p keeps the target alone and its log-probability is exactly 0; rows that
keep more are 0 to 4 of 16 at W = 2, and a zero output of the right shape passes a trial where there
are none: 5 of 20 seeds at W = 2 (computed in one process, 2026-11-26), so it fails a check of a few
trials. Where a row keeps more, the filter matters: the log-softmax over the whole row is off by more
than the tolerance in every one of the 20. The `pkb` variant draws heads whose kept sets hold 1 to 9
tokens.
"""

import math

import torch
import torch.distributed as dist

ID = 82
NAME = "vocab_parallel_log_prob_topk"
CATEGORY = "TP"
SOURCE = "NeMo-RL distributed log-probability with top-k/top-p (DistributedLogprobWithSampling)"
SUMMARY = "Log-prob of targets under top-10/top-0.9 of vocab-split bf16 logits [2, 8, 256/W]; the original's."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing vocab (256)"
# seq: at least this, and at least W, rounded up to a multiple of W; boost: added at each target
SIZES = {"pkb": {"batch": 2, "seq": 8, "vocab": 256, "target_step": 17, "target_offset": 3, "boost": 8.0}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
TOP_K = 10
TOP_P = 0.9


def seq_len(world_size, size):
    """The original's S: its minimum or W, rounded up to a multiple of W."""
    return -(-max(world_size, size["seq"]) // world_size) * world_size


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["vocab"] % world_size:
        return f"vocab = {size['vocab']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: standard normal logits per rank, boosted at the targets this rank owns; its
    arithmetic targets, their trial offset drawn per trial (shared); top_k 10, top_p 0.9."""
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
    return logits, target, None, TOP_K, TOP_P


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
def solution(vocab_parallel_logits, target, tp_group=None, top_k=None, top_p=1.0):
    w, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    batch, seq, v_local = vocab_parallel_logits.shape
    tokens = batch * seq
    per_rank = tokens // w

    # vocabulary split -> token split: rows j*per_rank.. of every rank's slice go to rank j
    received = vocab_parallel_logits.new_empty(w, per_rank, v_local)
    dist.all_to_all_single(received, vocab_parallel_logits.reshape(tokens, v_local), group=tp_group)
    rows = received.permute(1, 0, 2).reshape(per_rank, w * v_local)

    keep = _kept(rows, top_k, top_p)
    x = rows.float() if keep is None else rows.float().masked_fill(~keep, -math.inf)
    mine = target.reshape(tokens)[rank * per_rank : (rank + 1) * per_rank]
    log_prob = x.log_softmax(dim=-1).gather(1, mine.unsqueeze(1)).squeeze(1)

    gathered = [torch.empty_like(log_prob) for _ in range(w)]
    dist.all_gather(gathered, log_prob, group=tp_group)
    return torch.cat(gathered).view(batch, seq)


def traffic(ctx):
    """Per GPU, as for pkb's variant (problems/082): its share of each token's top-k values to the
    token's owner (top_k / W bf16 values from each other rank) and its tokens' float32 outputs to
    every other rank, in one round. Memory: read the logits and targets once, write the outputs."""
    w = ctx.world_size
    tokens = ctx.size["batch"] * seq_len(w, ctx.size)
    v_local = ctx.size["vocab"] // w
    return {
        "nvlink_bytes": (w - 1) / w * tokens * (TOP_K / w * 2 + 4),
        "hbm_bytes": tokens * v_local * ctx.dtype.itemsize + tokens * 8 + tokens * 4,
        "flops": 2 * tokens * v_local,
        "rounds": 1,
    }
