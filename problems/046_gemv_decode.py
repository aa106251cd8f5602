"""Vocabulary-parallel LM head at decode time: a GEMV on this rank's vocabulary shard, then an
all-gather of the logits.

The output embedding of a tensor-parallel language model generating one token per sequence. The
hidden states of the batch, hidden [batch, H], are replicated: every rank holds the same ones. The
vocabulary V is split across ranks: rank r holds rows r*V/W .. (r+1)*V/W of the LM head's weight,
weight_local [V/W, H] (nn.Linear layout), and of its bias, bias_local [V/W]. Every rank must return
the logits of the whole vocabulary, hidden @ weight^T + bias, a contiguous [batch, V] tensor in bf16
(float32 accumulation) whose columns r*V/W .. (r+1)*V/W come from rank r's shard.

Source: vocabulary-parallel LM head for decoding (ParallelKernelBench problem 46). The pkb sizes are
the original's (one sequence, H = 1024, V/W = 1024 rows per rank at 8 ranks, so V = 8192). At
batch 1 the work is a GEMV: reading the weight shard from HBM bounds it, and the gathered logits are
small. The large preset decodes a batch of 128 with a 256k vocabulary and H = 16384 (2 GiB of
weight per GPU at 4 ranks), which is still bound by reading the weight.
"""

import torch.distributed as dist
import torch.nn.functional as F

ID = 46
NAME = "gemv_decode"
CATEGORY = "TP"
SOURCE = "vocabulary-parallel LM head (Megatron-LM / vLLM style), decode step"
SUMMARY = "Decode LM head: hidden [B, H] @ weight_local[V/W, H]^T + bias_local, gathered: [B, V]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing vocab"
SIZES = {
    # batch: sequences decoded at once; hidden: model dimension; vocab: all logits (split across ranks)
    "pkb": {"batch": 1, "hidden": 1024, "vocab": 8192},
    "large": {"batch": 128, "hidden": 16384, "vocab": 262144},
}
# Logits are O(1): correct solutions differ in the order of the float32 accumulation (split-K GEMVs
# reduce in another order) and in whether the bias is added before or after rounding to bf16.
TOLERANCE = {"atol": 0.03, "rtol": 0.02, "rel_norm": 0.01}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["vocab"] % world_size:
        return f"vocab = {size['vocab']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): a few sequences, hidden
    a multiple of 64 and vocab of 64 W (padded vocabularies split into 64-row shards)."""
    return {
        "batch": draw("batch", 1, 8),
        "hidden": draw("hidden", 256, 1280, 64),
        "vocab": draw("vocab", 2048, 10240, 64 * world_size),
    }


def make_inputs(ctx):
    """hidden [B, H], the same on every rank; weight_local [V/W, H] scaled by 1/sqrt(H) and
    bias_local [V/W] ~ N(0, 0.5^2), different per rank: logits are O(1)."""
    batch, hidden, vocab = ctx.size["batch"], ctx.size["hidden"], ctx.size["vocab"]
    v_local = vocab // ctx.world_size
    hidden_states = ctx.randn(batch, hidden, shared=True)
    weight_local = ctx.randn(v_local, hidden, scale=hidden**-0.5)
    bias_local = ctx.randn(v_local, scale=0.5)
    return hidden_states, weight_local, bias_local


def solution(hidden_states, weight_local, bias_local):
    w = dist.get_world_size()
    logits_local = F.linear(hidden_states, weight_local, bias_local)  # [B, V/W]
    batch, v_local = logits_local.shape
    blocks = logits_local.new_empty(w * batch, v_local)  # rank r's columns in rows r*B .. (r+1)*B
    _all_gather(blocks, logits_local)
    # [B, V]: a copy for B > 1; for one row the blocks are already in vocabulary order (a view)
    return blocks.view(w, batch, v_local).permute(1, 0, 2).reshape(batch, w * v_local)


def traffic(ctx):
    """Per GPU: its [B, V/W] logits go to each of the W-1 peers.

    HBM: read the weight and bias shards and the hidden states, write the [B, V] logits; reading the
    weight dominates.
    """
    w = ctx.world_size
    batch, hidden, vocab = ctx.size["batch"], ctx.size["hidden"], ctx.size["vocab"]
    v_local = vocab // w
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * batch * v_local * isz,
        "hbm_bytes": (v_local * hidden + v_local + batch * hidden + batch * vocab) * isz,
        "flops": 2 * batch * hidden * v_local + batch * v_local,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(hidden_states: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor) "
        "-> torch.Tensor"
    ),
    "args": lambda inputs, env: inputs,
}
