"""The original benchmark's problem 2, exactly: all-gather of one bf16 matrix per rank.

Rank r holds a [1024, 1024] bf16 matrix filled with r + 1, as the original's input builder makes it;
every rank returns all of them stacked in rank order, [W, 1024, 1024], called as solution(tensor).
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: block r of the output is the constant r + 1, known without communicating.
The `pkb` variant's inputs are random per rank and trial.
"""

import math

import torch.distributed as dist

ID = 2
NAME = "allgather"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = (
    "Gather every rank's bf16 [1024, 1024] matrix (filled with rank + 1) on every rank (the original's)."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "block r of the output is the constant r + 1, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's matrix filled with rank + 1."""
    return (ctx.full((ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1),)


def solution(tensor):
    out = tensor.new_empty((dist.get_world_size(), *tensor.shape))
    # the original's all_gather_into_tensor into [W, ...], as a list of views: gloo (CPU) takes only this
    dist.all_gather(list(out.unbind(0)), tensor)
    return out


def traffic(ctx):
    """Per GPU: every other rank's matrix arrives once."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) * nbytes, "hbm_bytes": (1 + w) * nbytes, "flops": 0, "rounds": 1}
