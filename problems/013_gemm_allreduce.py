"""GEMM on K shards, then an all-reduce of the partial products: the row-parallel linear layer.

The row-parallel linear layer of Megatron-LM tensor parallelism (attention output projection,
second MLP GEMM). The inner dimension K = W * k_local is split across ranks: rank r holds the
activations' K shard A_local [M, k_local] and the matching row shard of the weight
B_local [k_local, N]. Every rank must return the full product sum_r A_r @ B_r, [M, N]: each rank's
partial product in bf16 (float32 accumulation), summed over ranks.

Source: Megatron-LM RowParallelLinear (ParallelKernelBench problem 13). As in the original, the
per-rank shard k_local is fixed, so any world size works and K grows with it.
"""

import torch.distributed as dist

ID = 13
NAME = "gemm_allreduce"
CATEGORY = "TP"
SOURCE = "Megatron-LM row-parallel linear"
SUMMARY = "Row-parallel linear: A_local [M, k_local] @ B_local [k_local, N], all-reduced: [M, N]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # m: rows; k_local: this rank's share of the inner dimension; n: output columns
    "pkb": {"m": 1024, "k_local": 512, "n": 1024},
    "large": {"m": 8192, "k_local": 4096, "n": 8192},
}
# Outputs are O(1). Correct solutions may round the partial products to bf16 or not, and sum them in
# any order: a few units in the last place of bf16.
TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.01}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): M (tokens) in 8s,
    k_local and N in 16s and 64s (hidden shards), k_local held to the pkb GEMM's work (seconds on a CPU)."""
    m, n = draw("m", 256, 1536, 8), draw("n", 256, 1536, 64)
    pkb = SIZES["pkb"]
    k_most = min(768, pkb["m"] * pkb["k_local"] * pkb["n"] // (m * n))
    return {"m": m, "n": n, "k_local": draw("k_local", 64, k_most, 16)}


def make_inputs(ctx):
    """A_local [M, k_local] and B_local [k_local, N] per rank; B scaled by 1/sqrt(K) so outputs are O(1)."""
    m, k_local, n = ctx.size["m"], ctx.size["k_local"], ctx.size["n"]
    a_local = ctx.randn(m, k_local)
    b_local = ctx.randn(k_local, n, scale=(ctx.world_size * k_local) ** -0.5)
    return a_local, b_local


def solution(a_local, b_local):
    out = a_local @ b_local
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: an all-reduce of the [M, N] partial product, 2(W-1)/W of it each way."""
    w = ctx.world_size
    m, k_local, n = ctx.size["m"], ctx.size["k_local"], ctx.size["n"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * m * n * isz,
        "hbm_bytes": (m * k_local + k_local * n + m * n) * isz,  # read A and B once, write the output once
        "flops": 2 * m * n * k_local + (w - 1) / w * m * n,  # the local GEMM, its share of the sum
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(A_local: torch.Tensor, B_local: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
