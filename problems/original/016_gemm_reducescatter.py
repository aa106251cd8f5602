"""The original benchmark's problem 16, exactly: a GEMM of K-shards, then a reduce-scatter of the rows.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds A_r
[1024, 512 / W] and B_r [512 / W, 1024]. Rank r returns rows r 1024/W .. (r+1) 1024/W - 1 of the
sum over ranks of A_r @ B_r, [1024 / W, 1024]. Called as solution(A_local, B_local). Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds
(pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 16
NAME = "gemm_reducescatter"
CATEGORY = "TP/SP"
SOURCE = "Megatron-LM sequence-parallel row-parallel linear"
SUMMARY = "Each rank's bf16 A_r [1024, 512/W] @ B_r [512/W, 1024], reduce-scattered by rows."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing k (512) and m (1024)"
SIZES = {"pkb": {"m": 1024, "k": 512, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    for key in ("k", "m"):
        if size[key] % world_size:
            return f"{key} = {size[key]} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: this rank's K-shards of A and B, standard normal."""
    s, k_local = ctx.size, ctx.size["k"] // ctx.world_size
    return ctx.randn(s["m"], k_local), ctx.randn(k_local, s["n"])


def solution(A_local, B_local):
    partial = torch.matmul(A_local, B_local)
    out = partial.new_empty((partial.shape[0] // dist.get_world_size(), partial.shape[1]))
    dist.reduce_scatter_tensor(out, partial, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: a ring's reduce-scatter sends (W-1)/W of the partial product."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    out = s["m"] * s["n"]
    k_local = s["k"] // w
    return {
        "nvlink_bytes": (w - 1) / w * out * isz,
        "hbm_bytes": (s["m"] * k_local + k_local * s["n"] + out + out // w) * isz,
        "flops": 2 * s["m"] * k_local * s["n"] + (w - 1) / w * out,
        "rounds": 1,
    }
