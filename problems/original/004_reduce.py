"""The original benchmark's problem 4, exactly: reduce (sum) of one bf16 matrix to rank 0.

Rank r holds a [1024, 1024] bf16 matrix filled with r + 1, as the original's input builder makes it,
and is called as solution(tensor, 0). Rank 0 returns the elementwise sum over all ranks; every other
rank returns its input unchanged (the input tensor itself may be returned there: `input_returned`).
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound.

What a solution could skip: the sum is the constant W (W + 1) / 2, known without communicating. The
`pkb` variant's inputs are random per rank and trial.
"""

import math

import torch.distributed as dist

ID = 4
NAME = "reduce"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Sum a bf16 [1024, 1024] matrix (filled with rank + 1) onto rank 0 (the original's inputs)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "the sum is the constant W (W + 1) / 2, known without communicating"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's matrix filled with rank + 1, and the root, 0."""
    return ctx.full((ctx.size["rows"], ctx.size["cols"]), ctx.rank + 1), 0


def input_returned(rank, world_size):
    """Where the output is the rank's input unchanged, so the input tensor itself may be returned."""
    return rank != 0


def solution(tensor, dst=0):
    out = tensor.clone()
    dist.reduce(out, dst=dst, op=dist.ReduceOp.SUM)
    # the original's reduce into a copy leaves a non-root copy as it was on NCCL; gloo (CPU) uses it as
    # scratch, so the input itself is returned there: the same values as the original's on GPUs
    return out if dist.get_rank() == dst else tensor


def traffic(ctx):
    """Per GPU: the root needs one matrix's worth of others' sums (reduce-scatter among the peers)."""
    elems = ctx.size["rows"] * ctx.size["cols"]
    nbytes = elems * ctx.dtype.itemsize
    return {
        "nvlink_bytes": nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": elems,
        "rounds": 1 if ctx.world_size == 2 else 2,
    }
