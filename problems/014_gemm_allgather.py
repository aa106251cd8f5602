"""GEMM with this rank's column shard of the weight, then an all-gather of the output columns.

The column-parallel linear layer of Megatron-LM tensor parallelism with gather_output=True. The
activations A [M, K] are replicated: every rank holds the same A. The weight's N output columns are
split across ranks: rank r holds B_local [K, N/W], columns r*N/W .. (r+1)*N/W of B. Every rank must
return the whole product C = A @ B, [M, N] contiguous row-major in bf16 (float32 accumulation, what
torch.matmul does), where columns r*N/W .. (r+1)*N/W come from rank r's shard.

Source: Megatron-LM ColumnParallelLinear with gather_output (ParallelKernelBench problem 14). The
sizes are the original's: A [1024, 512] and N = 1024 split over the ranks (B_local [512, 128] at 8
ranks). The gathered blocks are column blocks, so a plain all-gather (which stacks row blocks) needs
a transpose into place afterwards; a custom kernel can write each block where it belongs. Since A is
on every rank, gathering the weight shards instead (and computing all of C locally) moves K x N/W
instead of M x N/W elements per peer: the roofline's floor takes the cheaper (traffic()).
"""

import torch.distributed as dist

ID = 14
NAME = "gemm_allgather"
CATEGORY = "TP"
SOURCE = "Megatron-LM column-parallel linear with gather_output"
SUMMARY = "Column-parallel linear: replicated A [M, K] @ B_local [K, N/W], gathered along N: [M, N]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing n"
SIZES = {
    # m: rows; k: inner dimension; n: all output columns (split across ranks)
    "pkb": {"m": 1024, "k": 512, "n": 1024},
    "large": {"m": 8192, "k": 8192, "n": 16384},
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
    if size["n"] % world_size:
        return f"n = {size['n']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): M (tokens) in 8s, K
    in 64s, N in 16 W so each rank's columns are 16-aligned, K held to the pkb GEMM's work (CPU seconds)."""
    m, n = draw("m", 256, 1536, 8), draw("n", 256, 1536, 16 * world_size)
    pkb = SIZES["pkb"]
    k_most = min(768, pkb["m"] * pkb["k"] * pkb["n"] // (m * n))
    return {"m": m, "n": n, "k": draw("k", 64, k_most, 64)}


def make_inputs(ctx):
    """A [M, K], the same on every rank, and B_local [K, N/W] per rank, scaled so outputs are O(1)."""
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    a = ctx.randn(m, k, shared=True)
    b_local = ctx.randn(k, n // ctx.world_size, scale=k**-0.5)
    return a, b_local


def solution(a, b_local):
    w = dist.get_world_size()
    c_local = a @ b_local
    m, n_local = c_local.shape
    blocks = c_local.new_empty(w * m, n_local)  # rank r's columns in rows r*M .. (r+1)*M
    _all_gather(blocks, c_local)
    return blocks.view(w, m, n_local).permute(1, 0, 2).reshape(m, w * n_local)


def traffic(ctx):
    """Per GPU, each field the minimum over the two schedules a solution may choose (so the floor is
    no larger than either's):
    - gather the output (the reference): its [M, N/W] block of C goes to each of the W-1 peers;
    - gather the weight: its [K, N/W] shard of B goes to each of the W-1 peers, and each rank then
      multiplies the replicated A by the whole B (W times the FLOPs, no output exchange).
    The weight is the smaller message whenever K < M (the pkb size: half the bytes).
    """
    w = ctx.world_size
    m, k, n = ctx.size["m"], ctx.size["k"], ctx.size["n"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * min(m, k) * (n // w) * isz,
        # read A and the weight shard, write the whole [M, N] output once (gathering the output)
        "hbm_bytes": (m * k + k * (n // w) + m * n) * isz,
        "flops": 2 * m * (n // w) * k,  # gathering the output: this rank's columns only
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
