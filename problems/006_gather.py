"""Gather of one bf16 matrix from every rank onto rank 0.

Each rank holds a different random [rows, cols] matrix. Rank 0 (the root) must return all of them
stacked in rank order, [world_size, rows, cols]; every other rank returns its own input, unchanged,
as the original workload does: the input tensor itself may be returned there (`input_returned`;
outputs are copied at return, so nothing is lost), or a copy. The primitive behind collecting
results on one process.

Source: torch.distributed.gather with dst 0 (ParallelKernelBench problem 6). Unlike the original,
the inputs are random and differ per rank and per trial.
"""

import torch.distributed as dist

ID = 6
NAME = "gather"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Gather a bf16 [rows, cols] matrix onto rank 0 as [W, rows, cols]; other ranks return their input."
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
    """One random matrix per rank, different on every rank and in every trial."""
    return (ctx.randn(ctx.size["rows"], ctx.size["cols"]),)


def input_returned(rank, world_size):
    """Where the output is the rank's input unchanged, so the input tensor itself may be returned."""
    return rank != 0


def solution(x):
    if dist.get_rank() == 0:
        out = x.new_empty(dist.get_world_size(), *x.shape)
        dist.gather(x, gather_list=list(out.unbind(0)), dst=0)
        return out
    dist.gather(x, gather_list=None, dst=0)
    return x


def traffic(ctx):
    """Per GPU: the root must receive W-1 matrices; every other rank sends one."""
    w = ctx.world_size
    chunk = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * chunk,
        "hbm_bytes": (w + 1) * chunk,  # the root reads its input and writes the W-matrix output
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor, dst: int = 0) -> torch.Tensor",
    "args": lambda inputs, env: inputs,  # the original passes the tensor alone: dst keeps its default
}
