"""The original benchmark's problem 8, exactly: all-to-all of W bf16 blocks per rank.

Rank r holds [W, 1024, 1024] bf16 whose block d is filled with 10 r + d, as the original's input
builder makes it; rank r returns [W, 1024, 1024] whose block s is rank s's block r (filled with
10 s + r), called as solution(tensor). Judged as the original harness judges: atol = rtol = 1e-2, no
norm bound.

What a solution could skip: every block of the output is a known constant, so the answer is known
without communicating. The `pkb` variant's inputs are random per rank and trial.
"""

import math

import torch
import torch.distributed as dist

ID = 8
NAME = "alltoall"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = (
    "All-to-all of W bf16 [1024, 1024] blocks per rank, block d filled with 10 rank + d (the original's)."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "every block of the output is a known constant, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}  # each block's
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: block d filled with 10 rank + d."""
    shape = (ctx.size["rows"], ctx.size["cols"])
    return (torch.stack([ctx.full(shape, 10 * ctx.rank + d) for d in range(ctx.world_size)]),)


def solution(tensor):
    out = torch.empty_like(tensor)
    dist.all_to_all_single(out, tensor)
    return out


def traffic(ctx):
    """Per GPU: W - 1 blocks leave it and W - 1 arrive."""
    w = ctx.world_size
    block = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) * block, "hbm_bytes": 2 * w * block, "flops": 0, "rounds": 1}
