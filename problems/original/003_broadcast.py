"""The original benchmark's problem 3, exactly: broadcast of rank 0's bf16 matrix.

Rank r holds a [1024, 1024] bf16 matrix filled with r + 1, as the original's input builder makes it;
every rank returns rank 0's, called as solution(tensor) (src defaults to 0). Judged as the original
harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: rank 0's matrix is all ones, so every rank knows the answer without
communicating. The `pkb` variant's inputs are random per rank and trial.
"""

import math

import torch.distributed as dist

ID = 3
NAME = "broadcast"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Broadcast rank 0's bf16 [1024, 1024] matrix (all ones) to every rank (the original's inputs)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "rank 0's matrix is all ones, so every rank knows the answer without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's matrix filled with rank + 1."""
    return (ctx.full((ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1),)


def solution(tensor, src=0):
    out = tensor.clone()
    dist.broadcast(out, src=src)
    return out


def traffic(ctx):
    """Per GPU: the root sends the matrix once (scatter, then all-gather among the peers)."""
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": 0,
        "rounds": 1 if ctx.world_size == 2 else 2,
    }
