"""Broadcast of one bf16 matrix from rank 0 to every rank.

Every rank holds a different random [rows, cols] matrix; every rank must return rank 0's matrix.
The other ranks' inputs only fix the output's shape and dtype. The primitive behind parameter
initialization in data parallelism (DDP broadcasts rank 0's weights at start-up).

Source: torch.distributed.broadcast with src 0 (ParallelKernelBench problem 3). Unlike the
original, the inputs are random and differ per rank and per trial, so a rank cannot return its own
matrix and pass.
"""

import torch
import torch.distributed as dist

ID = 3
NAME = "broadcast"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Broadcast rank 0's bf16 [rows, cols] matrix; every rank returns it."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 16384, "cols": 12288},
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
    """One random matrix per rank; only rank 0's values reach the output."""
    return (ctx.randn(ctx.size["rows"], ctx.size["cols"]),)


def solution(x):
    # The root sends from a copy so that its input stays untouched; the others receive into a new buffer.
    out = x.clone() if dist.get_rank() == 0 else torch.empty_like(x)
    dist.broadcast(out, src=0)
    return out


def traffic(ctx):
    """Per GPU: the matrix, once.

    Every byte starts on rank 0, so the root must send the whole matrix at least once. That is also
    enough for everyone: the root sends a different 1/(W-1) piece to each peer and the peers pass
    their pieces to one another (a scatter, then an all-gather among the W-1 peers), so no GPU sends
    more than one matrix, in two dependent steps (one when W = 2).
    """
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": nbytes,
        "hbm_bytes": 2 * nbytes,  # the root reads its input and writes its output; a peer does less
        "flops": 0,
        "rounds": 1 if w == 2 else 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor, src: int = 0) -> torch.Tensor",
    "args": lambda inputs, env: inputs,  # the original passes the tensor alone: src keeps its default
}
