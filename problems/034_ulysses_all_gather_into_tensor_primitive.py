"""Ulysses all-gather of one tensor along its first dimension into one output tensor.

Every rank holds a bf16 tensor x [rows, cols], different on every rank; every rank must return the W
tensors stacked along the rows in rank order, [W*rows, cols]: rows r*rows .. (r+1)*rows - 1 are rank
r's x. The reference is one all_gather_into_tensor into a fresh output.

Source: VeOmni's Ulysses `all_gather_into_tensor` primitive (ParallelKernelBench problem 34). The
signature and the call (x, None) are the original's; group None is the default (world) group. x is
random and differs per rank and trial.

Differences from the original: none.
"""

import torch.distributed as dist

ID = 34
NAME = "ulysses_all_gather_into_tensor_primitive"
CATEGORY = "SP"
SOURCE = "VeOmni Ulysses sequence parallelism (all_gather_into_tensor)"
SUMMARY = "All-gather bf16 x [rows, cols] from every rank into one [W*rows, cols] tensor."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # rows, cols: this rank's x
    "pkb": {"rows": 1024, "cols": 1024},
    # 512 MiB per rank, received from the one peer at W = 2: about 1.4 ms at 395 GB/s (an estimate
    # until measured)
    "large": {"rows": 16384, "cols": 16384},
}
# Pure data movement: every correct solution returns the same bits.
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
    """x [rows, cols], standard normal, different on every rank; the original's (x, None)."""
    return ctx.randn(ctx.size["rows"], ctx.size["cols"]), None


def solution(x, group=None):
    out = x.new_empty(dist.get_world_size(group) * x.shape[0], *x.shape[1:])
    _all_gather(out, x.contiguous(), group=group)
    return out


def traffic(ctx):
    """Per GPU: its x to each of the W-1 peers, and theirs from them.

    Every schedule (direct, ring, tree) delivers each rank's x to W-1 others; a ring relays instead
    of sending W-1 copies, with the same bytes per GPU. Memory: read x, write the W-times larger
    output.
    """
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * nbytes,
        "hbm_bytes": (1 + w) * nbytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(x, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": "none.",
}
