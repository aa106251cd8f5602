"""All-to-all of a stack of bf16 matrices.

Each rank holds a different random [world_size, rows, cols] stack. Slice d of rank s's input goes
to rank d, where it becomes slice s of the output: out_d[s] = x_s[d], every rank returning
[world_size, rows, cols]. The primitive behind expert-parallel token dispatch and Ulysses
sequence parallelism.

Source: torch.distributed.all_to_all_single (ParallelKernelBench problem 8). Unlike the original,
the inputs are random and differ per rank and per trial.
"""

import torch
import torch.distributed as dist

ID = 8
NAME = "alltoall"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "All-to-all of a bf16 [W, rows, cols] stack: slice d goes to rank d."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 8192, "cols": 8192},
}
# Pure data movement: the output must be bit-exact.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any matrix whose rows
    are a multiple of 8 and columns a multiple of 16 (the alignment a vectorised kernel may assume)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """One random [W, rows, cols] stack per rank, different on every rank and in every trial."""
    return (ctx.randn(ctx.world_size, ctx.size["rows"], ctx.size["cols"]),)


def solution(x):
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


def traffic(ctx):
    """Per GPU: W-1 of its W slices go to other ranks, (W-1)/W of the stack."""
    w = ctx.world_size
    chunk = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * chunk,
        "hbm_bytes": 2 * w * chunk,  # read the input stack once, write the output stack once
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
