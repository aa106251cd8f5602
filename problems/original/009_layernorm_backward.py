"""The original benchmark's problem 9, exactly: LayerNorm's weight and bias gradients, all-reduced.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds its
rows of the normalized input X_hat [1024, 1024] (each row scaled to unit norm) and of the output
gradient dY [1024, 1024]. Every rank returns (d_gamma, d_beta) = (sum over every rank's rows of
dY * X_hat, sum over every rank's rows of dY), each [1024] bf16, called as solution(X_hat, dY).
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch.distributed as dist

ID = 9
NAME = "layernorm_backward"
CATEGORY = "TP/SP"
SOURCE = "Megatron-LM sequence-parallel LayerNorm (weight and bias gradients)"
SUMMARY = "Column sums of bf16 dY * X_hat and dY [1024, 1024] per rank, all-reduced (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "hidden": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: unit-norm rows of X_hat (norm + 1e-5) and dY, standard normal bf16."""
    s = ctx.size
    x_hat = ctx.randn(s["rows"], s["hidden"])
    if not ctx.is_meta:
        x_hat = x_hat / (x_hat.norm(dim=-1, keepdim=True) + 1e-5)
    return x_hat, ctx.randn(s["rows"], s["hidden"])


def solution(X_hat, dY):
    d_beta = dY.sum(dim=0)
    d_gamma = (dY * X_hat).sum(dim=0)
    dist.all_reduce(d_beta, op=dist.ReduceOp.SUM)
    dist.all_reduce(d_gamma, op=dist.ReduceOp.SUM)
    return d_gamma, d_beta


def traffic(ctx):
    """Per GPU: the two [hidden] sums all-reduced, 2 (W-1)/W of them each way."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    elems = s["rows"] * s["hidden"]
    return {
        "nvlink_bytes": 2 * (w - 1) / w * 2 * s["hidden"] * isz,
        "hbm_bytes": (2 * elems + 2 * s["hidden"]) * isz,
        "flops": 3 * elems,
        "rounds": 2,
    }
