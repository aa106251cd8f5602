"""The original benchmark's problem 5, exactly: scatter of rank 0's chunks.

As the original's input builder makes them: rank 0 holds [W, 1024, 1024] bf16 whose chunk i is filled
with i + 1; every other rank holds a zero [1024, 1024] matrix. Called as solution(tensor) (src
defaults to 0); rank r returns chunk r, [1024, 1024]. Judged as the original harness judges: atol =
rtol = 1e-2, no norm bound.

What a solution could skip: rank r's chunk is the constant r + 1, known without communicating. The
`pkb` variant's inputs are random per rank and trial.
"""

import math

import torch
import torch.distributed as dist

ID = 5
NAME = "scatter"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = (
    "Scatter rank 0's W bf16 [1024, 1024] chunks (chunk i filled with i + 1), one per rank (the original's)."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "rank r's chunk is the constant r + 1, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: the root's chunks filled with 1 .. W; zeros elsewhere."""
    shape = (ctx.size["rows"], ctx.size["cols"])
    if ctx.rank == 0:
        return (torch.stack([ctx.full(shape, i + 1) for i in range(ctx.world_size)]),)
    return (ctx.full(shape, 0),)


def solution(tensor, src=0):
    if dist.get_rank() == src:
        chunks = [c.squeeze(0).contiguous() for c in tensor.chunk(dist.get_world_size(), dim=0)]
        out = torch.empty_like(chunks[0])
    else:
        chunks = None
        out = tensor.clone()
    dist.scatter(out, scatter_list=chunks, src=src)
    return out


def traffic(ctx):
    """Per GPU: the root sends every other rank its chunk."""
    w = ctx.world_size
    chunk = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) * chunk, "hbm_bytes": (w + 1) * chunk, "flops": 0, "rounds": 1}
