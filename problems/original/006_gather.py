"""The original benchmark's problem 6, exactly: gather of every rank's bf16 matrix on rank 0.

Rank r holds a [1024, 1024] bf16 matrix filled with r + 1, as the original's input builder makes it,
and is called as solution(tensor) (dst defaults to 0). Rank 0 returns all of them stacked in rank
order, [W, 1024, 1024]; every other rank returns its input (the tensor itself, as the original does:
`input_returned`). Judged as the original harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: block r of the root's output is the constant r + 1, known without
communicating. The `pkb` variant's inputs are random per rank and trial.
"""

import math

import torch
import torch.distributed as dist

ID = 6
NAME = "gather"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Gather every rank's bf16 [1024, 1024] matrix (filled with rank + 1) on rank 0 (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "block r of the root's output is the constant r + 1, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's matrix filled with rank + 1."""
    return (ctx.full((ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1),)


def input_returned(rank, world_size):
    """Where the output is the rank's input unchanged, so the input tensor itself may be returned."""
    return rank != 0


def solution(tensor, dst=0):
    if dist.get_rank() != dst:
        dist.gather(tensor, gather_list=None, dst=dst)
        return tensor
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.gather(tensor, gather_list=gathered, dst=dst)
    return torch.stack(gathered, dim=0)


def traffic(ctx):
    """Per GPU: the root receives every other rank's matrix."""
    w = ctx.world_size
    chunk = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) * chunk, "hbm_bytes": (w + 1) * chunk, "flops": 0, "rounds": 1}
