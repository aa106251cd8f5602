"""The original benchmark's problem 11, exactly: all-gather of A's column blocks, then a GEMM, transposed.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds A_local
[1024, 512 / W], its block of A's columns, and its own B [512, 1024]; B differs from rank to rank.
Rank r returns (B_r^T A^T)^T = A @ B_r, [1024, 1024] (a transposed view, as the original's), where A
[1024, 512] is every rank's block side by side in rank order. Called as solution(A_local, B). Judged
as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret
seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 11
NAME = "allgather_gemm_at"
CATEGORY = "TP"
SOURCE = "sequence-parallel column-parallel linear, weight-gradient GEMM (async-TP style)"
SUMMARY = "All-gather A's bf16 column blocks [1024, 512/W] transposed, then (B_r^T A^T)^T (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing k (512)"
SIZES = {"pkb": {"m": 1024, "k": 512, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["k"] % world_size:
        return f"k = {size['k']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: this rank's column block of A and its own B, standard normal."""
    s = ctx.size
    return ctx.randn(s["m"], s["k"] // ctx.world_size), ctx.randn(s["k"], s["n"])


def solution(A_local, B):
    blocks = [torch.empty_like(A_local.t().contiguous()) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, A_local.t().contiguous())
    return torch.matmul(B.t(), torch.cat(blocks, dim=0)).t()


def traffic(ctx):
    """Per GPU: every other rank's block of A arrives once; the GEMM is this rank's own."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * s["m"] * s["k"] // w * isz,
        "hbm_bytes": (s["m"] * s["k"] + s["k"] * s["n"] + s["m"] * s["n"]) * isz,
        "flops": 2 * s["m"] * s["k"] * s["n"],
        "rounds": 1,
    }
