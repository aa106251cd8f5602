"""The original benchmark's problem 25, exactly: an importance-sampling policy-gradient loss over an LM
head, with its metrics, all in bf16.

As the original's input builder makes them (a seed per rank): rank r holds hidden states bf16
[1024, 1024] and its own LM head weight bf16 [32000, 1024] (drawn per rank, N(0, 1)), labels int64
[1024] uniform in [0, 32000) (none ignored), old_logprobs and advantages bf16 [1024], N(0, 1), and is
called as solution(hidden_states, weight, labels, old_logprobs, advantages, -100). Each rank computes
bf16 logits and their cross entropy (the per-token negative log-probability, bf16), the log-ratio
new - old clamped to [-20, 20], the ratio and the policy-gradient term -ratio * advantage; seven
all-reduces (SUM, MIN, MAX) give the valid-token count and the sums and extremes over every rank.
Every rank returns (loss float32 [], None, per_token_logprobs bf16 [1024], per_token_loss bf16 [1024],
metrics float32 [5]: mean ratio, least, largest, mean k3 = ratio - log ratio - 1, mean negative
log-probability).

What a solution could skip: the logits' standard deviation is 32, so every log-probability is far
below -20 and every log-ratio sits at the clamp: every ratio is e^-20 (2e-9), the loss and the
per-token losses are within 1e-8 of 0, the least, largest and mean ratio too, and k3 is 19 on every
rank; only the mean negative log-probability (about 133) differs by rank, by about 1% (132.3 and
133.9 on two ranks in one draw), so at the original's size a rank's own mean is mostly within the
tolerance of the global one. At the CPU size below it is not: the two ranks' means differ by 1-5%
(113 and 119 in one draw, 112.0 and 113.9 in another), and a solution that skips the all-reduces
fails there in its first trials.

On CPU (the tests' machine: 2 cores) one bf16 LM head of 1024 x 1024 x 32000 takes about 8 s per rank,
so on a CPU device make_inputs draws cpu_tokens tokens per rank (32) and a vocabulary of cpu_vocab
(4096); shapes on `meta` and the GPU use the original's 1024 and 32000.

Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 25
NAME = "importance_sampling_loss"
CATEGORY = "DP"
SOURCE = "RL trainer importance-sampling policy-gradient loss (PPO/GRPO style), ParallelKernelBench"
SUMMARY = "RL importance-sampling loss over a bf16 LM head [32000, 1024], seven all-reduces (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"tokens": 1024, "hidden": 1024, "vocab": 32000, "cpu_tokens": 32, "cpu_vocab": 4096}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    return None


def make_inputs(ctx):
    """The original's: every tensor N(0, 1) from the rank's seed, labels uniform (reduced on CPU)."""
    s = ctx.size
    cpu = ctx.device.type == "cpu"
    t, v = (s["cpu_tokens"], s["cpu_vocab"]) if cpu else (s["tokens"], s["vocab"])
    hidden = ctx.randn(t, s["hidden"])
    weight = ctx.randn(v, s["hidden"])
    labels = ctx.randint(0, v, t)
    return hidden, weight, labels, ctx.randn(t), ctx.randn(t), -100


def solution(hidden_states, weight, labels, old_logprobs, advantages, ignore_index=-100):
    logits = F.linear(hidden_states, weight)
    labels_flat = labels.view(-1)
    ce = F.cross_entropy(
        logits.view(-1, logits.size(-1)), labels_flat, ignore_index=ignore_index, reduction="none"
    )
    new_lp = -ce
    valid = labels_flat != ignore_index
    n_local = valid.sum().float()
    n_global = n_local.clone()
    dist.all_reduce(n_global)
    n = n_global.clamp(min=1.0)

    delta = (new_lp - old_logprobs.view(-1)).masked_fill(~valid, 0.0).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(delta)
    per_token_pg = -(ratio * advantages.view(-1)).masked_fill(~valid, 0.0)
    pg_sum = per_token_pg.sum()
    dist.all_reduce(pg_sum)
    true_pg = pg_sum / n
    weighted = (ratio * advantages.view(-1)).masked_fill(~valid, 0.0)
    surrogate = (weighted * ce).sum() / n
    loss = true_pg + surrogate - surrogate  # the straight-through pg + s - s, no gradient here

    ratio_sum = ratio.masked_fill(~valid, 0.0).sum()
    dist.all_reduce(ratio_sum)
    least = ratio.masked_fill(~valid, float("inf")).min()
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    largest = ratio.masked_fill(~valid, float("-inf")).max()
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    k3_sum = (ratio - delta - 1.0).masked_fill(~valid, 0.0).sum()
    dist.all_reduce(k3_sum)
    entropy_sum = ce.masked_fill(~valid, 0.0).sum()
    dist.all_reduce(entropy_sum)
    metrics = torch.stack([ratio_sum / n, least, largest, k3_sum / n, entropy_sum / n])
    return loss, None, new_lp.view_as(labels), per_token_pg.view_as(labels), metrics


def traffic(ctx):
    """Per GPU, the least: seven float32 values a rank combined in one round (56 bytes through each GPU
    around a ring, 28 at W = 2); the weight and the batch read once; the LM head's FLOPs."""
    s, t = ctx.size, ctx.size["tokens"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": 28 if ctx.world_size == 2 else 56,
        "hbm_bytes": (s["vocab"] * s["hidden"] + t * s["hidden"]) * isz + t * (8 + 4 * isz),
        "flops": 2 * t * s["hidden"] * s["vocab"] + 4 * t * s["vocab"],
        "rounds": 1,
    }
