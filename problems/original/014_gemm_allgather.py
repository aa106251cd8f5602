"""The original benchmark's problem 14, exactly: a GEMM per rank, then an all-gather of the column blocks.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds its
own A_r [1024, 512] (A differs from rank to rank) and B_r [512, 1024 / W]. Every rank returns the
products side by side in rank order, [A_0 @ B_0, ..., A_{W-1} @ B_{W-1}], [1024, 1024]. Called as
solution(A, B). Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs
are drawn from secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 14
NAME = "gemm_allgather"
CATEGORY = "TP"
SOURCE = "Megatron-LM column-parallel linear with gather_output"
SUMMARY = "Each rank's bf16 A_r [1024, 512] @ B_r [512, 1024/W]; the products gathered side by side."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing n (1024)"
SIZES = {"pkb": {"m": 1024, "k": 512, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["n"] % world_size:
        return f"n = {size['n']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: this rank's A and its column block of B, standard normal."""
    s = ctx.size
    return ctx.randn(s["m"], s["k"]), ctx.randn(s["k"], s["n"] // ctx.world_size)


def solution(A, B):
    product = torch.matmul(A, B)
    blocks = [torch.empty_like(product) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, product)
    return torch.cat(blocks, dim=1)


def traffic(ctx):
    """Per GPU: every other rank's product block arrives once."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    block = s["m"] * s["n"] // w
    return {
        "nvlink_bytes": (w - 1) * block * isz,
        "hbm_bytes": (s["m"] * s["k"] + s["k"] * s["n"] // w + s["m"] * s["n"]) * isz,
        "flops": 2 * s["m"] * s["k"] * s["n"] // w,
        "rounds": 1,
    }
