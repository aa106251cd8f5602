"""The original benchmark's problem 1, exactly: all-reduce (sum) of one bf16 matrix.

Rank r holds a [1024, 1024] bf16 matrix filled with r + 1, as the original's input builder makes it;
every rank returns the elementwise sum over all ranks, called as solution(tensor). Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: every input is a known constant, so the answer, W (W + 1) / 2 everywhere,
is known without communicating. The `pkb` variant's inputs are random per rank and trial.
"""

import math

import torch.distributed as dist

ID = 1
NAME = "allreduce"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Sum a bf16 [1024, 1024] matrix filled with rank + 1 over all ranks (the original's inputs)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "every input is a known constant, so the answer, W (W + 1) / 2 everywhere, is known without communicating"
)
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's matrix filled with rank + 1."""
    return (ctx.full((ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1),)


def solution(tensor):
    out = tensor.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: a reduce-scatter plus an all-gather moves 2(W-1)/W of the matrix each way."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": (w - 1) / w * ctx.size["rows"] * ctx.size["cols"],
        "rounds": 2,
    }
