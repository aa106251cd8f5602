"""The original benchmark's problem 7, exactly: reduce-scatter (sum) of a bf16 matrix of W blocks.

Rank r holds [W * 1024, 1024] bf16 filled with r + 1, as the original's input builder makes it;
rank r returns block r of the elementwise sum over all ranks, [1024, 1024], called as
solution(tensor). Judged as the original harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: the sum is the constant W (W + 1) / 2, known without communicating. The
`pkb` variant's inputs are random per rank and trial.
"""

import math

import torch.distributed as dist

ID = 7
NAME = "reducescatter"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Reduce-scatter a bf16 [W * 1024, 1024] matrix filled with rank + 1 (the original's inputs)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "the sum is the constant W (W + 1) / 2, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}  # rows: each rank's block of the output
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: W blocks of rows, all filled with rank + 1."""
    return (ctx.full((ctx.world_size * ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1),)


def solution(tensor):
    out = tensor.new_empty((tensor.shape[0] // dist.get_world_size(), *tensor.shape[1:]))
    dist.reduce_scatter_tensor(out, tensor, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: W - 1 blocks' partial sums leave it (a ring's reduce-scatter)."""
    w = ctx.world_size
    elems = ctx.size["rows"] * ctx.size["cols"]
    block = elems * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * block,
        "hbm_bytes": (w + 1) * block,
        "flops": (w - 1) * elems,
        "rounds": 1,
    }
