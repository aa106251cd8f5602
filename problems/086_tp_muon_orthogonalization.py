"""Muon's Newton-Schulz orthogonalization of a momentum matrix whose rows are split across ranks.

The Muon optimizer replaces a weight's update by the nearest semi-orthogonal matrix to its
momentum, computed with a few Newton-Schulz iterations. When the weight is tensor-parallel, so is
its momentum: here the full momentum G [W * rows_local, cols] is split along its rows and rank r
holds rows r*rows_local .. (r+1)*rows_local - 1 as g_local [rows_local, cols] in bf16. Every rank
must return its rows of the orthogonalized update, bf16 [rows_local, cols], defined as follows
(float32 state, every product in float32, TF32 off):

  X = G / (|G|_F + 1e-7)                    (|G|_F over all ranks: an all-reduce)
  5 times:  A = X^T X                       ([cols, cols]: the sum over ranks of X_r^T X_r)
            X = a X + X (b A + c A A)       with (a, b, c) = (3.4445, -4.7750, 2.0315)
  out = X * sqrt(W * rows_local), rounded to bf16

The Gram matrix is taken over the short side (cols), so the row split needs only an all-reduce of
a small [cols, cols] matrix per step and no exchange of X itself. The final scale gives the update
an RMS of about 1, the sqrt(max(rows, cols)) scaling that Moonlight's Muon uses (without its 0.2),
so the output is O(1) and judgeable.

Source: tensor-parallel Muon, Newton-Schulz quintic iteration (ParallelKernelBench problem 86).
Unlike the original, which runs in bf16 whatever dtype is asked for, the iteration is defined in
float32. DTYPE is float32 because it is the dtype of all the arithmetic (the roofline's compute
peak); the momentum and the update are bf16, as in the original. The momentum's columns have
random scales spread over 50x, like a gradient's uneven spectrum, so small singular values must be
amplified and the iteration's rounding behaviour matters.
"""

import math

import torch
import torch.distributed as dist

ID = 86
NAME = "tp_muon_orthogonalization"
CATEGORY = "TP"
SOURCE = "Muon optimizer (Newton-Schulz orthogonalization) with tensor-parallel momentum"
SUMMARY = "5 Newton-Schulz quintic steps (float32) on a row-sharded bf16 momentum [rows_local, cols]."
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # rows_local: this rank's rows of the momentum; cols: its width (the short side)
    "pkb": {"rows_local": 512, "cols": 64},
    "large": {"rows_local": 4096, "cols": 1024},
}
STEPS = 5
COEFFS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7
# Measured on CPU (W = 4 and 8, up to [2048, 512] per rank): float32 solutions that sum the Gram
# matrices in another order, split the GEMMs' inner dimension or iterate in float64 differ from the
# reference by a relative norm of 4e-5 to 8e-5 and by at most one bf16 unit in the last place per
# element. TF32 GEMMs give 3e-3 to 4.5e-3, bf16 GEMMs 2e-2 to 3e-2: both are outside the contract
# (float32) and outside rel_norm = 1e-3, which leaves float32 a margin of more than 10x.
TOLERANCE = {"atol": 0.02, "rtol": 0.02, "rel_norm": 1e-3}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """Gaussian rows times per-column scales, log-uniform in [1/50, 1] and shared by all ranks."""
    rows_local, cols = ctx.size["rows_local"], ctx.size["cols"]
    col_scales = torch.exp(ctx.rand(cols, low=-math.log(50.0), high=0.0, dtype=torch.float32, shared=True))
    g_local = (ctx.randn(rows_local, cols, dtype=torch.float32) * col_scales).to(torch.bfloat16)
    return (g_local,)


def solution(g_local):
    a, b, c = COEFFS
    rows_total = dist.get_world_size() * g_local.shape[0]
    x = g_local.float()
    sum_sq = x.square().sum().reshape(1)
    dist.all_reduce(sum_sq, op=dist.ReduceOp.SUM)
    x.div_(sum_sq.sqrt_().add_(EPS))
    for _ in range(STEPS):
        gram = x.T @ x
        dist.all_reduce(gram, op=dist.ReduceOp.SUM)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A A
        x = torch.addmm(x, x, poly, beta=a)  # a X + X (b A + c A A)
    return x.mul_(math.sqrt(rows_total)).to(torch.bfloat16)


def traffic(ctx):
    """Per GPU: one scalar all-reduce, then one all-reduce of a symmetric [cols, cols] Gram per step.

    A Gram matrix is symmetric, so only its upper triangle, cols(cols+1)/2 float32 values, needs
    reducing; an all-reduce moves at least 2(W-1)/W of its buffer through each GPU's links, and the
    STEPS + 1 all-reduces depend on one another (a round each). FLOPs: the Gram as a symmetric
    rank-k update (half a GEMM), A A (symmetric, half a GEMM), and X (b A + c A A) in full. Memory:
    read the momentum and write the update; X ([rows_local, cols] float32) can stay on chip between
    steps.
    """
    w = ctx.world_size
    rows, cols = ctx.size["rows_local"], ctx.size["cols"]
    tri = cols * (cols + 1) // 2
    per_step_flops = 2 * rows * tri + 2 * cols * tri + 2 * rows * cols * cols + 3 * tri + 2 * rows * cols
    return {
        "nvlink_bytes": 2 * (w - 1) / w * 4 * (1 + STEPS * tri),
        "hbm_bytes": 2 * rows * cols * 2,  # bf16 in, bf16 out
        "flops": STEPS * per_step_flops + 3 * rows * cols,
        "rounds": STEPS + 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(x: torch.Tensor, steps: int = 5, coefficient_type: str = 'quintic', "
        "partition_dim: int = 1, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "args": None,
    "differences": (
        "The original splits the momentum's columns (partition_dim 1) and runs the five-step quintic "
        "coefficient schedule; here the rows are split and one coefficient triple is used at every step, "
        "in float32, so the original's call computes another function."
    ),
}
