"""All-reduce (sum) of one bf16 matrix across every rank.

Each rank holds a different random [rows, cols] matrix; every rank must return the elementwise
sum over all ranks. The primitive under data-parallel gradient synchronization and under the
row-parallel layers of tensor parallelism.

Source: torch.distributed.all_reduce (ParallelKernelBench problem 1). Unlike the original, the
inputs are random and differ per rank and per trial, so the answer cannot be known without
communicating.
"""

import torch.distributed as dist

ID = 1
NAME = "allreduce"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Sum a bf16 [rows, cols] matrix over all ranks; every rank returns the sum."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 16384, "cols": 8192},
}
# bf16 sums taken in a different order differ by a few units in the last place.
TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.005}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any matrix whose rows
    are a multiple of 8 and columns a multiple of 16 (the alignment a vectorised kernel may assume)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """One random matrix per rank, different on every rank and in every trial.

    Scaled by 1/sqrt(W) so the sum stays O(1) at any world size and the bf16 rounding of
    differently ordered sums stays well inside the tolerance.
    """
    return (ctx.randn(ctx.size["rows"], ctx.size["cols"], scale=ctx.world_size**-0.5),)


def solution(x):
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: a reduce-scatter plus an all-gather moves 2(W-1)/W of the matrix each way."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,  # read the input once, write the output once
        "flops": (w - 1) / w * ctx.size["rows"] * ctx.size["cols"],
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
