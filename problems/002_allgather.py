"""All-gather of one bf16 matrix from every rank.

Each rank holds a different random [rows, cols] matrix; every rank must return all of them
stacked in rank order, [world_size, rows, cols] (slice r is rank r's matrix). The primitive under
ZeRO/FSDP parameter gathering and the sequence-parallel regions of tensor parallelism.

Source: torch.distributed all-gather into one tensor (ParallelKernelBench problem 2). Unlike the
original, the inputs are random and differ per rank and per trial, so the answer cannot be known
without communicating.
"""

import torch.distributed as dist

ID = 2
NAME = "allgather"
CATEGORY = "primitive"
SOURCE = "torch.distributed"
SUMMARY = "Gather a bf16 [rows, cols] matrix from every rank; every rank returns [W, rows, cols]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 8192, "cols": 8192},
}
# Pure data movement: the output must be bit-exact.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any matrix whose rows
    are a multiple of 8 and columns a multiple of 16 (the alignment a vectorised kernel may assume)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """One random matrix per rank, different on every rank and in every trial."""
    return (ctx.randn(ctx.size["rows"], ctx.size["cols"]),)


def solution(x):
    out = x.new_empty(dist.get_world_size(), *x.shape)
    # The concatenated [W * rows, cols] view of the stacked output: every backend accepts that form.
    _all_gather(out.flatten(0, 1), x)
    return out


def traffic(ctx):
    """Per GPU: its matrix goes to each of the W-1 peers (and W-1 matrices come back)."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * nbytes,
        "hbm_bytes": (1 + w) * nbytes,  # read the input once, write the W-matrix output once
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(tensor: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
    # a concatenated [W * rows, cols] result is the same bytes as our stack: viewed as [W, rows, cols]
    "outputs": lambda out, args, env: (
        out.view(env.world_size, *args[0].shape) if getattr(out, "dim", lambda: 0)() == 2 else out
    ),
}
