"""The original benchmark's problem 46, exactly: a vocabulary-parallel LM head GEMV, then an all-gather.

As the original's input builder makes them (random normal bf16, drawn once for all ranks): one
token's hidden_states [1, 1024], the same on every rank, and an LM head of V = 1024 W rows, of which
rank r holds rows r * 1024 .. (r + 1) * 1024 - 1: weight_shard [1024, 1024] and bias_shard [1024].
It is called as solution(hidden_states, weight_shard, bias_shard). Each rank computes its logits
hidden_states @ weight_shard^T + bias_shard in bf16 and all-gathers them along the vocabulary:
every rank returns [1, V], rank r's logits in columns r * 1024 .. (r + 1) * 1024 - 1. Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds
(pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 46
NAME = "gemv_decode"
CATEGORY = "TP"
SOURCE = "vocabulary-parallel LM head (Megatron-LM / vLLM style), decode step"
SUMMARY = "Logits of one bf16 token against a [1024, 1024] vocabulary shard, all-gathered to [1, 1024 W]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"m": 1024, "hidden": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _dims(ctx):
    m, w = ctx.size["m"], ctx.world_size
    tokens = max(1, min(8, m // 1024))
    vocab = -(-max(m, w * 1024) // w) * w
    return tokens, ctx.size["hidden"], vocab // w


def make_inputs(ctx):
    """The original's: the same hidden states on every rank, this rank's rows of one weight and bias."""
    tokens, hidden, local = _dims(ctx)
    return ctx.randn(tokens, hidden, shared=True), ctx.randn(local, hidden), ctx.randn(local)


@torch.no_grad()
def solution(hidden_states, weight_shard, bias_shard):
    w = dist.get_world_size()
    logits = torch.matmul(hidden_states, weight_shard.t()) + bias_shard
    tokens, local = logits.shape
    gathered = logits.new_empty(w * tokens, local)
    dist.all_gather_into_tensor(gathered, logits)
    return gathered.view(w, tokens, local).permute(1, 0, 2).reshape(tokens, w * local)


def traffic(ctx):
    """Per GPU: its [tokens, 1024] logits to each of the W - 1 peers. Memory: reading the weight
    shard dominates."""
    tokens, hidden, local = _dims(ctx)
    w, isz = ctx.world_size, ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * tokens * local * isz,
        "hbm_bytes": (local * hidden + local + tokens * hidden + tokens * w * local) * isz,
        "flops": 2 * tokens * hidden * local + tokens * local,
        "rounds": 1,
    }
