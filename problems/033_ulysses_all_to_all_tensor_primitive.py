"""Ulysses all-to-all of one tensor: split it along one dimension, exchange, concatenate along another.

The primitive under DeepSpeed-Ulysses / VeOmni sequence parallelism. Every rank holds a bf16 tensor x;
it is split into W equal chunks along `scatter_dim`; chunk j goes to rank j; every rank must return the
W chunks it receives (one from each rank, in rank order) concatenated along `gather_dim`. With the
original's call, x is [rows, cols], scatter_dim = 0 and gather_dim = 1: rank r returns
[rows/W, W*cols], whose column block j holds rows r*rows/W .. (r+1)*rows/W - 1 of rank j's x.

The reference builds one contiguous send buffer with the scatter dimension first (no copy at all when
scatter_dim = 0), runs one all_to_all_single and rearranges what arrives with one copy; it works for
any pair of dimensions, as the original's signature allows.

Source: VeOmni's Ulysses `all_to_all_tensor` (ParallelKernelBench problem 33). The signature and the
call (x, 0, 1, None) are the original's; group None is the default (world) group. x is random and
differs per rank and trial.

Differences from the original: none in the contract; the reference sends one buffer with
all_to_all_single where the original passes lists of chunks to all_to_all.
"""

import torch.distributed as dist

ID = 33
NAME = "ulysses_all_to_all_tensor_primitive"
CATEGORY = "SP"
SOURCE = "VeOmni Ulysses sequence parallelism (all_to_all_tensor)"
SUMMARY = "All-to-all of bf16 x [rows, cols]: scatter rows, gather columns -> [rows/W, W*cols]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing rows (1024 at the pkb size)"
SIZES = {
    # rows, cols: this rank's x; rows is scattered over the ranks, cols gathered
    "pkb": {"rows": 1024, "cols": 1024},
    # 1 GiB per rank: half of it crosses NVLink at W = 2, about 1.4 ms at 395 GB/s (an estimate
    # until measured)
    "large": {"rows": 16384, "cols": 32768},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["rows"] % world_size:
        return f"rows = {size['rows']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): rows in multiples of
    8 W (the rule, with 8-aligned chunks), columns in multiples of 16."""
    return {"rows": draw("rows", 256, 1536, 8 * world_size), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """x [rows, cols], standard normal, different on every rank; the original's (x, 0, 1, None)."""
    return ctx.randn(ctx.size["rows"], ctx.size["cols"]), 0, 1, None


def solution(x, scatter_dim, gather_dim, group=None):
    w = dist.get_world_size(group)
    s, g = scatter_dim % x.dim(), gather_dim % x.dim()
    # [W, n/W, ...rest]: chunk j (for rank j) first; a view when s = 0 and x is contiguous
    send = x.movedim(s, 0).unflatten(0, (w, -1)).contiguous()
    recv = send.new_empty(send.shape)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] is rank j's chunk for this rank: put its dimension s back, then lay the W chunks side
    # by side along g (one copy)
    pieces = recv.movedim(1, s + 1)
    return pieces.movedim(0, g).flatten(g, g + 1)


def traffic(ctx):
    """Per GPU: every chunk but its own goes to another rank, (W-1)/W of x each way.

    That is the least any schedule can send: the chunk for rank j exists only on this rank. Memory:
    read x once and write the output once (a kernel writing straight into the peers' outputs needs no
    send buffer).
    """
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(x, scatter_dim, gather_dim, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "none in the contract; the reference sends one buffer with all_to_all_single where the original "
        "passes lists of chunks to all_to_all."
    ),
}
