"""Reduce-scatter (sum) of a bf16 matrix split into one row block per rank.

Each rank holds a different random [world_size * rows, cols] matrix, seen as world_size row blocks
of [rows, cols]. Rank r must return the elementwise sum over all ranks of block r. The primitive
under ZeRO-2/FSDP gradient sharding and the sequence-parallel row-parallel layers of tensor
parallelism. `rows` is the per-rank output size, so the input grows with the world size.

Source: torch.distributed reduce-scatter into one tensor (ParallelKernelBench problem 7). Unlike
the original, the inputs are random and differ per rank and per trial.
"""

import torch.distributed as dist

ID = 7
NAME = "reducescatter"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Sum bf16 [W*rows, cols] matrices over ranks; rank r returns row block r, [rows, cols]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 8192, "cols": 8192},
}
# bf16 sums taken in a different order differ by a few units in the last place (the inputs are
# scaled so that partial sums stay O(1)).
TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.01}

# torch 2.13 renamed reduce_scatter_tensor to reduce_scatter_single; both run the same collective.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any matrix whose rows
    are a multiple of 8 and columns a multiple of 16 (the alignment a vectorised kernel may assume)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """One random [W * rows, cols] matrix per rank, scaled by 1/sqrt(W) so that sums are O(1) at any W."""
    return (ctx.randn(ctx.world_size * ctx.size["rows"], ctx.size["cols"], scale=ctx.world_size**-0.5),)


def solution(x):
    out = x.new_empty(x.shape[0] // dist.get_world_size(), x.shape[1])
    _reduce_scatter(out, x, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU: each of its W-1 foreign blocks goes to the rank that owns it, (W-1)/W of the input."""
    w = ctx.world_size
    elems = ctx.size["rows"] * ctx.size["cols"]
    block = elems * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * block,
        "hbm_bytes": (w + 1) * block,  # read the W-block input once, write the one-block output once
        "flops": (w - 1) * elems,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
