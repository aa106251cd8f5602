"""All-gather of sequence-sharded activations, then a GEMM with this rank's weight shard.

The column-parallel linear layer of Megatron-LM sequence parallelism, the pattern that async tensor
parallelism fuses (all-gather overlapped with matmul). The activations A [M, K] are split along M
(the token dimension) across ranks: rank r holds rows r*M/W .. (r+1)*M/W, A_local [M/W, K]. Each
rank also holds its own column shard of the weight, B_local [K, N], different on every rank. Every
rank must return all_gather(A) @ B_local, [M, N], in bf16 with float32 accumulation (what
torch.matmul does).

Source: async-TP all-gather + matmul (ParallelKernelBench problem 12). The original gathers K
shards of A and multiplies by a B that every rank holds in full, so all ranks compute the same
product; here the gather is along M, as in Megatron-LM's sequence-parallel layers, and each rank
computes its own slice of the layer's output. The gathered A [M, K], B [K, N] and the output have
the original's shapes (M = N = 1024, K = 512), so the GEMM is the same size.
"""

import torch.distributed as dist

ID = 12
NAME = "allgather_gemm"
CATEGORY = "TP"
SOURCE = "Megatron-LM sequence parallelism / PyTorch async-TP"
SUMMARY = "All-gather bf16 A [M/W, K] along M, then multiply by this rank's B [K, N]: [M, N]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing m"
SIZES = {
    # m: rows of the gathered A and of the output; k: inner dimension; n: this rank's output columns
    "pkb": {"m": 1024, "k": 512, "n": 1024},
    "large": {"m": 8192, "k": 8192, "n": 4096},
}
# Outputs are O(1): the only difference between correct solutions is the order of the float32
# accumulation and the final rounding to bf16 (one unit in the last place).
TOLERANCE = {"atol": 0.03, "rtol": 0.02, "rel_norm": 0.01}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["m"] % world_size:
        return f"m = {size['m']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): M (tokens) in 8 W so
    shards are 8-aligned, K, N in 64s (hidden sizes), K held to the pkb GEMM's work (seconds on a CPU)."""
    m, n = draw("m", 256, 1536, 8 * world_size), draw("n", 256, 1536, 64)
    pkb = SIZES["pkb"]
    k_most = min(768, pkb["m"] * pkb["k"] * pkb["n"] // (m * n))
    return {"m": m, "n": n, "k": draw("k", 64, k_most, 64)}


def make_inputs(ctx):
    """A_local [M/W, K] and B_local [K, N], both different per rank; B scaled so outputs are O(1)."""
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    a_local = ctx.randn(m // ctx.world_size, k)
    b_local = ctx.randn(k, n, scale=k**-0.5)
    return a_local, b_local


def solution(a_local, b_local):
    a_full = a_local.new_empty(dist.get_world_size() * a_local.shape[0], a_local.shape[1])
    _all_gather(a_full, a_local)
    return a_full @ b_local


def traffic(ctx):
    """Per GPU: its A shard goes to each of the W-1 peers; the GEMM is the full [M, K] x [K, N]."""
    w = ctx.world_size
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * (m // w) * k * isz,
        # Read the A shard, B, write the output; the gathered A need not be stored, a fused kernel
        # can consume the peers' shards as they arrive.
        "hbm_bytes": ((m // w) * k + k * n + m * n) * isz,
        "flops": 2 * m * n * k,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(A_local: torch.Tensor, B: torch.Tensor) -> torch.Tensor",
    "args": None,
    "differences": (
        "The original gathers K shards of A and multiplies by a B that every rank holds, so every rank "
        "computes the same product; here A is gathered along M (the tokens, as Megatron-LM's "
        "sequence-parallel layers do) and each rank multiplies by its own B_local. The original's call "
        "has no counterpart in these inputs."
    ),
}
