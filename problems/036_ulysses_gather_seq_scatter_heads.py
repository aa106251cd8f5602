"""Ulysses attention input exchange: gather the sequence, scatter the heads.

Before attention under DeepSpeed-Ulysses / VeOmni sequence parallelism, every rank holds its share of
the sequence for all heads, x bf16 [batch, seq_local, heads, head_dim] (rank r holds positions
r*seq_local .. (r+1)*seq_local - 1). One all-to-all gives every rank the whole sequence for its share
of the heads: rank r must return [batch, W*seq_local, heads/W, head_dim] holding heads
r*heads/W .. (r+1)*heads/W - 1, positions in rank order. With the original's call (x, 1, 2, None, 0),
seq_dim = 1 and head_dim = 2; unpadded_dim_size = 0 means no padding to remove (a non-zero value cuts
the gathered sequence back to that length, as VeOmni does after padding).

The reference lays x out with the heads first in one send buffer (one copy), runs one
all_to_all_single and places what arrives with one more copy; it works for any pair of dimensions.

Source: VeOmni's Ulysses `gather_seq_scatter_heads` (ParallelKernelBench problem 36). The signature
and the call are the original's; group None is the default (world) group. x is random and differs
per rank and trial; per-rank shapes stay the original's at every world size.

Differences from the original: none in the contract; the reference sends one buffer with
all_to_all_single where the original passes lists of chunks to all_to_all.
"""

import torch.distributed as dist

ID = 36
NAME = "ulysses_gather_seq_scatter_heads"
CATEGORY = "Ulysses"
SOURCE = "VeOmni Ulysses sequence parallelism (gather_seq_scatter_heads)"
SUMMARY = "All-to-all of bf16 [B, S/W, H, D]: gather the sequence, scatter the heads -> [B, S, H/W, D]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing heads (8 at the pkb size, as the original asserts)"
SIZES = {
    # this rank's x: batch, seq_local positions, all heads, head_dim
    "pkb": {"batch": 16, "seq_local": 16, "heads": 8, "head_dim": 64},
    # 1 GiB per rank (a 64K-token sequence over 2 ranks, 32 heads of 128): half crosses NVLink at
    # W = 2, about 1.4 ms at 395 GB/s (an estimate until measured)
    "large": {"batch": 4, "seq_local": 32768, "heads": 32, "head_dim": 128},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["heads"] % world_size:
        return f"heads = {size['heads']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any batch and sequence
    shard, heads a multiple of W (they are scattered over the ranks) and head_dim a multiple of 16."""
    return {
        "batch": draw("batch", 1, 16),
        "seq_local": draw("seq_local", 1, 24),
        "heads": draw("heads", world_size, max(16, 4 * world_size), world_size),
        "head_dim": draw("head_dim", 16, 128, 16),
    }


def make_inputs(ctx):
    """x [batch, seq_local, heads, head_dim], standard normal; the original's (x, 1, 2, None, 0)."""
    s = ctx.size
    return ctx.randn(s["batch"], s["seq_local"], s["heads"], s["head_dim"]), 1, 2, None, 0


def _all_to_all(x, scatter_dim, gather_dim, group):
    w = dist.get_world_size(group)
    s, g = scatter_dim % x.dim(), gather_dim % x.dim()
    # [W, n/W, ...rest]: the block for rank j first (one copy, none when s = 0 and x is contiguous)
    send = x.movedim(s, 0).unflatten(0, (w, -1)).contiguous()
    recv = send.new_empty(send.shape)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] came from rank j: put dimension s back, then lay the W blocks along g (one copy)
    return recv.movedim(1, s + 1).movedim(0, g).flatten(g, g + 1)


def solution(x, seq_dim, head_dim, group=None, unpadded_dim_size=0):
    out = _all_to_all(x, head_dim, seq_dim, group)
    if unpadded_dim_size and unpadded_dim_size < out.shape[seq_dim]:
        out = out.narrow(seq_dim, 0, unpadded_dim_size).contiguous()
    return out


def traffic(ctx):
    """Per GPU: every head block but its own goes to the rank that owns those heads, (W-1)/W of x.

    No schedule sends less: the block for rank j exists only here. Memory: read x once and write the
    output once (a kernel writing straight into the peers' outputs needs no send buffer).
    """
    w = ctx.world_size
    s = ctx.size
    nbytes = s["batch"] * s["seq_local"] * s["heads"] * s["head_dim"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(x, seq_dim, head_dim, group=None, unpadded_dim_size=0)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "none in the contract; the reference sends one buffer with all_to_all_single where the original "
        "passes lists of chunks to all_to_all."
    ),
}
