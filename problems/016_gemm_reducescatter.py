"""GEMM on K shards, then a reduce-scatter of the partial products along M.

The row-parallel linear layer of Megatron-LM with sequence parallelism: instead of all-reducing the
partial products, each rank keeps only its block of M rows (tokens) of the sum. The inner dimension
K is split across ranks: rank r holds A_local [M, K/W] and the matching row shard of the weight
B_local [K/W, N]. Rank r must return rows r*M/W .. (r+1)*M/W of sum_s A_s @ B_s, [M/W, N]: each
rank's partial product in bf16 (float32 accumulation), summed over ranks.

Source: Megatron-LM sequence-parallel RowParallelLinear (ParallelKernelBench problem 16). The
sizes are the original's: K = 512 and M = 1024 split over the ranks. At these sizes sending each
rank A's rows it owns plus the B shard moves fewer bytes than reduce-scattering the [M, N] partial
products: the roofline's floor takes the cheaper (traffic()).
"""

import torch.distributed as dist

ID = 16
NAME = "gemm_reducescatter"
CATEGORY = "TP/SP"
SOURCE = "Megatron-LM sequence-parallel row-parallel linear"
SUMMARY = "A_local [M, K/W] @ B_local [K/W, N], reduce-scattered along M: [M/W, N] per rank."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing both m and k"
SIZES = {
    # m: rows of the full product; k: the whole inner dimension (split across ranks); n: columns
    "pkb": {"m": 1024, "k": 512, "n": 1024},
    "large": {"m": 8192, "k": 16384, "n": 8192},
}
# Outputs are O(1). Correct solutions may round the partial products to bf16 or not, and sum them in
# any order: a few units in the last place of bf16.
TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.01}

# torch 2.13 renamed reduce_scatter_tensor to reduce_scatter_single; both run the same collective.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    for key in ("m", "k"):
        if size[key] % world_size:
            return f"{key} = {size[key]} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): M (tokens) in 8 W, K
    in 16 W so shards are aligned, N in 64s, K held to the pkb GEMM's work (seconds on a CPU)."""
    m, n = draw("m", 256, 1536, 8 * world_size), draw("n", 256, 1536, 64)
    pkb = SIZES["pkb"]
    k_most = min(768, pkb["m"] * pkb["k"] * pkb["n"] // (m * n))
    return {"m": m, "n": n, "k": draw("k", 128, k_most, 16 * world_size)}


def make_inputs(ctx):
    """A_local [M, K/W] and B_local [K/W, N] per rank; B scaled by 1/sqrt(K) so outputs are O(1)."""
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    k_local = k // ctx.world_size
    a_local = ctx.randn(m, k_local)
    b_local = ctx.randn(k_local, n, scale=k**-0.5)
    return a_local, b_local


def solution(a_local, b_local):
    partial = a_local @ b_local
    out = partial.new_empty(partial.shape[0] // dist.get_world_size(), partial.shape[1])
    _reduce_scatter(out, partial, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU, each field the minimum over the two schedules a solution may choose (so the floor is
    no larger than either's):
    - reduce-scatter the partial products (the reference): each of the W-1 foreign row blocks
      [M/W, N] of its partial product goes to its owner;
    - gather the inputs of one's own rows: to each peer, the peer's rows of A_local [M/W, K/W] and
      the whole B_local [K/W, N]; each rank then computes its [M/W, N] rows over all of K.
    The second is the smaller message whenever M K / W + K N < M N (the pkb size at W = 4: 1.6x
    fewer bytes); both take one round and the same GEMM FLOPs.
    """
    w = ctx.world_size
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    k_local = k // w
    isz = ctx.dtype.itemsize
    reduce_scatter = (w - 1) * (m // w) * n
    gather_inputs = (w - 1) * ((m // w) * k_local + k_local * n)
    return {
        "nvlink_bytes": min(reduce_scatter, gather_inputs) * isz,
        "hbm_bytes": (m * k_local + k_local * n + m // w * n) * isz,  # read A and B, write the block
        "flops": 2 * m * n * k_local,  # the GEMM work of one rank, either way
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(A_local: torch.Tensor, B_local: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
