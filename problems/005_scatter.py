"""Scatter of a stack of bf16 matrices from rank 0.

Rank 0 (the root) holds a random [world_size, rows, cols] stack; every rank r must return slice r
of the root's stack, [rows, cols]. The other ranks receive an input of the same shape, also random,
which the workload ignores. The primitive behind handing out data shards from one process.

Source: torch.distributed.scatter with src 0 (ParallelKernelBench problem 5). Unlike the original,
the root's stack is random and differs per trial, so a rank cannot guess its chunk.
"""

import torch.distributed as dist

ID = 5
NAME = "scatter"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Scatter rank 0's bf16 [W, rows, cols] stack; rank r returns slice r."
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
    """A random [W, rows, cols] stack on every rank; only the root's is read."""
    return (ctx.randn(ctx.world_size, ctx.size["rows"], ctx.size["cols"]),)


def solution(x):
    out = x.new_empty(x.shape[1:])
    chunks = list(x.unbind(0)) if dist.get_rank() == 0 else None
    dist.scatter(out, scatter_list=chunks, src=0)
    return out


def traffic(ctx):
    """Per GPU: the root must send W-1 chunks; every other rank receives one."""
    w = ctx.world_size
    chunk = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * chunk,
        "hbm_bytes": (w + 1) * chunk,  # the root reads its W chunks and writes its own output chunk
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor, src: int = 0) -> torch.Tensor",
    # the root passes its stack; the others a [rows, cols] buffer, the shape the original gives them
    "args": lambda inputs, env: inputs if env.rank == 0 else (inputs[0].new_empty(inputs[0].shape[1:]),),
    "differences": (
        "Ranks other than the root get a fresh [rows, cols] buffer, as the original gives them (ours "
        "gives every rank a [W, rows, cols] stack, read on the root only)."
    ),
}
