"""Reduce (sum) of one bf16 matrix onto rank 0.

Each rank holds a different random [rows, cols] matrix. Rank 0 (the root) must return the
elementwise sum over all ranks; every other rank returns its own input, unchanged, as the original
workload does (a reduce leaves the non-root buffers as they were): the input tensor itself may be
returned there (`input_returned`; outputs are copied at return, so nothing is lost), or a copy. The
primitive behind collecting gradients or metrics on one process.

Source: torch.distributed.reduce with dst 0 (ParallelKernelBench problem 4). Unlike the original,
the inputs are random and differ per rank and per trial, so the sum cannot be known without
communicating.
"""

import torch.distributed as dist

ID = 4
NAME = "reduce"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Sum a bf16 [rows, cols] matrix onto rank 0; other ranks return their input."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 16384, "cols": 12288},
}
# bf16 sums taken in a different order differ by a few units in the last place (the inputs are
# scaled so that partial sums stay O(1)); the non-root outputs are copies, exact for any correct
# solution.
TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.01}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any matrix whose rows
    are a multiple of 8 and columns a multiple of 16 (the alignment a vectorised kernel may assume)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """One random matrix per rank, scaled by 1/sqrt(W) so that the sum is O(1) at any world size."""
    return (ctx.randn(ctx.size["rows"], ctx.size["cols"], scale=ctx.world_size**-0.5),)


def input_returned(rank, world_size):
    """Where the output is the rank's input unchanged, so the input tensor itself may be returned."""
    return rank != 0


def solution(x):
    if dist.get_rank() == 0:
        out = x.clone()
        dist.reduce(out, dst=0, op=dist.ReduceOp.SUM)
        return out
    # NCCL only reads the non-root buffers; gloo uses them as scratch space, so it gets a copy
    dist.reduce(x.clone() if "gloo" in dist.get_backend() else x, dst=0, op=dist.ReduceOp.SUM)
    return x


def traffic(ctx):
    """Per GPU: the matrix, once.

    The root needs the sum of the other W-1 matrices: a matrix's worth of bytes it does not hold.
    The other ranks reduce-scatter among themselves and each sends its summed 1/(W-1) piece to the
    root, so no GPU sends more than one matrix, in two dependent steps (one when W = 2).
    """
    w = ctx.world_size
    elems = ctx.size["rows"] * ctx.size["cols"]
    nbytes = elems * ctx.dtype.itemsize
    return {
        "nvlink_bytes": nbytes,
        "hbm_bytes": 2 * nbytes,  # every rank reads its input once and writes its output once
        "flops": elems,  # the root adds the others' sum to its own matrix
        "rounds": 1 if w == 2 else 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor, dst: int = 0) -> torch.Tensor",
    "args": lambda inputs, env: (inputs[0], 0),
}
