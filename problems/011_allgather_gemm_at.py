"""All-gather of K shards stored transposed (K-major), then a GEMM that contracts over K.

The inner dimension K of C = A @ B is split across ranks, and each rank holds its shard of A
transposed: rank r holds a_t_local = A[:, r*K/W : (r+1)*K/W]^T, [K/W, M], contiguous, so the
shards are whole rows of A^T and gather without a copy. This is how sequence-sharded activations
meet a GEMM that contracts over the sequence: in the backward of a sequence-parallel column-parallel
linear layer, the activations X [tokens, hidden] are gathered along tokens again and the weight
gradient is X^T @ dY, so A^T = X, K = tokens and M = hidden. Each rank also holds its own
B_local [K, N] (its columns of dY), different on every rank. Every rank must return
C = A @ B_local = all_gather(a_t_local)^T @ B_local as a new contiguous row-major [M, N] tensor in
bf16 (float32 accumulation, what torch.matmul does).

Source: all-gather + GEMM with a transposed A (ParallelKernelBench problem 11, "allgather_gemm_AT").
The original is given A_local [M, K/W], transposes it with a copy before gathering, multiplies by a
B held by every rank, and returns a non-contiguous transposed view of an [N, M] product. Here the
shard arrives K-major (no copy needed), B differs by rank so every rank's output is its own, and the
output is a freshly allocated contiguous [M, N]. The GEMM has the original's shape (M = N = 1024,
K = 512).
"""

import torch.distributed as dist

ID = 11
NAME = "allgather_gemm_at"
CATEGORY = "TP"
SOURCE = "sequence-parallel column-parallel linear, weight-gradient GEMM (async-TP style)"
SUMMARY = "All-gather K-major A^T shards [K/W, M], then A @ B_local [K, N]: contiguous [M, N]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing k"
SIZES = {
    # m: rows of A and of the output; k: the whole inner dimension (split across ranks);
    # n: this rank's output columns
    "pkb": {"m": 1024, "k": 512, "n": 1024},
    "large": {"m": 8192, "k": 16384, "n": 4096},
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
    if size["k"] % world_size:
        return f"k = {size['k']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): M, N in 64s (hidden
    sizes), K (tokens) in 8 W so shards are 8-aligned, held to the pkb GEMM's work (seconds on a CPU)."""
    m, n = draw("m", 256, 1536, 64), draw("n", 256, 1536, 64)
    pkb = SIZES["pkb"]
    k_most = min(768, pkb["m"] * pkb["k"] * pkb["n"] // (m * n))
    return {"m": m, "n": n, "k": draw("k", 128, k_most, 8 * world_size)}


def make_inputs(ctx):
    """a_t_local [K/W, M] and B_local [K, N], both different per rank; B scaled so outputs are O(1)."""
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    a_t_local = ctx.randn(k // ctx.world_size, m)
    b_local = ctx.randn(k, n, scale=k**-0.5)
    return a_t_local, b_local


def solution(a_t_local, b_local):
    a_t = a_t_local.new_empty(dist.get_world_size() * a_t_local.shape[0], a_t_local.shape[1])
    _all_gather(a_t, a_t_local)  # A^T [K, M]: the shards are consecutive row blocks
    return a_t.t() @ b_local  # the GEMM reads A^T as a transposed operand; C is a new [M, N]


def traffic(ctx):
    """Per GPU: its A^T shard goes to each of the W-1 peers; the GEMM is the full [M, K] x [K, N]."""
    w = ctx.world_size
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * (k // w) * m * isz,
        # Read the A^T shard, B, write the output; the gathered A^T need not be stored, a fused
        # kernel can consume the peers' shards as they arrive.
        "hbm_bytes": ((k // w) * m + k * n + m * n) * isz,
        "flops": 2 * m * n * k,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(A_local: torch.Tensor, B: torch.Tensor) -> torch.Tensor",
    # A_local [M, K/W] is the transposed view of this rank's K-major shard (no copy)
    "args": lambda inputs, env: (inputs[0].t(), inputs[1]),
    "differences": (
        "A_local arrives as a transposed (non-contiguous) view of the K-major shard, and B differs by "
        "rank (the original's B is the same on every rank), so every rank's product is its own."
    ),
}
