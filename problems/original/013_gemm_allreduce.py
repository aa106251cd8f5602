"""The original benchmark's problem 13, exactly: a GEMM per rank, then an all-reduce of the products.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds its
own A_r [1024, 512] and B_r [512, 1024]. Every rank returns the sum over ranks of A_r @ B_r,
[1024, 1024]. Called as solution(A_local, B_local). Judged as the original harness judges: atol =
rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 13
NAME = "gemm_allreduce"
CATEGORY = "TP"
SOURCE = "Megatron-LM row-parallel linear"
SUMMARY = "Each rank's bf16 A_r [1024, 512] @ B_r [512, 1024], summed over ranks on every rank."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"m": 1024, "k": 512, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's A and B, standard normal."""
    s = ctx.size
    return ctx.randn(s["m"], s["k"]), ctx.randn(s["k"], s["n"])


def solution(A_local, B_local):
    out = torch.matmul(A_local, B_local)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: a reduce-scatter plus an all-gather of the product, 2 (W-1)/W of it each way."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    out = s["m"] * s["n"]
    return {
        "nvlink_bytes": 2 * (w - 1) / w * out * isz,
        "hbm_bytes": (s["m"] * s["k"] + s["k"] * s["n"] + out) * isz,
        "flops": 2 * s["m"] * s["k"] * s["n"] + (w - 1) / w * out,
        "rounds": 2,
    }
