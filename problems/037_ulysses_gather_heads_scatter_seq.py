"""Ulysses attention output exchange: gather the heads, scatter the sequence.

After attention under DeepSpeed-Ulysses / VeOmni sequence parallelism, every rank holds the whole
sequence for its share of the heads, x bf16 [batch, seq, heads_local, head_dim] (rank r holds heads
r*heads_local .. (r+1)*heads_local - 1). One all-to-all gives every rank its share of the sequence for
all heads: rank r must return [batch, seq/W, W*heads_local, head_dim] holding positions
r*seq/W .. (r+1)*seq/W - 1, heads in rank order. With the original's call (x, 1, 2, None),
seq_dim = 1 and head_dim = 2.

The reference lays x out with the sequence first in one send buffer (one copy), runs one
all_to_all_single and places what arrives with one more copy; it works for any pair of dimensions.

Source: VeOmni's Ulysses `gather_heads_scatter_seq` (ParallelKernelBench problem 37). The signature
and the call are the original's; group None is the default (world) group. x is random and differs
per rank and trial; per-rank shapes stay the original's at every world size.

Differences from the original: VeOmni pads the sequence to a multiple of W before the exchange; here
the world size must divide seq, so there is never padding (nor was there at the original's sizes:
seq = 16 and 8 % W == 0). The reference sends one buffer with all_to_all_single where the original
passes lists of chunks to all_to_all.
"""

import torch.distributed as dist

ID = 37
NAME = "ulysses_gather_heads_scatter_seq"
CATEGORY = "Ulysses"
SOURCE = "VeOmni Ulysses sequence parallelism (gather_heads_scatter_seq)"
SUMMARY = "All-to-all of bf16 [B, S, H/W, D]: gather the heads, scatter the sequence -> [B, S/W, H, D]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing seq (16 at the pkb size; the original asserts 8 % W == 0)"
SIZES = {
    # this rank's x: batch, the whole sequence, its heads_local heads, head_dim
    "pkb": {"batch": 16, "seq": 16, "heads_local": 8, "head_dim": 64},
    # 1 GiB per rank (a 64K-token sequence, 16 heads of 128 per rank): half crosses NVLink at
    # W = 2, about 1.4 ms at 395 GB/s (an estimate until measured)
    "large": {"batch": 4, "seq": 65536, "heads_local": 16, "head_dim": 128},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["seq"] % world_size:
        return f"seq = {size['seq']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any batch and count
    of local heads, seq a multiple of W (it is scattered over the ranks), head_dim a multiple of 16."""
    return {
        "batch": draw("batch", 1, 16),
        "seq": draw("seq", world_size, max(32, 4 * world_size), world_size),
        "heads_local": draw("heads_local", 1, 12),
        "head_dim": draw("head_dim", 16, 128, 16),
    }


def make_inputs(ctx):
    """x [batch, seq, heads_local, head_dim], standard normal; the original's (x, 1, 2, None)."""
    s = ctx.size
    return ctx.randn(s["batch"], s["seq"], s["heads_local"], s["head_dim"]), 1, 2, None


def _all_to_all(x, scatter_dim, gather_dim, group):
    w = dist.get_world_size(group)
    s, g = scatter_dim % x.dim(), gather_dim % x.dim()
    # [W, n/W, ...rest]: the block for rank j first (one copy, none when s = 0 and x is contiguous)
    send = x.movedim(s, 0).unflatten(0, (w, -1)).contiguous()
    recv = send.new_empty(send.shape)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] came from rank j: put dimension s back, then lay the W blocks along g (one copy)
    return recv.movedim(1, s + 1).movedim(0, g).flatten(g, g + 1)


def solution(x, seq_dim, head_dim, group=None):
    return _all_to_all(x, seq_dim, head_dim, group)


def traffic(ctx):
    """Per GPU: every sequence block but its own goes to the rank that owns those positions,
    (W-1)/W of x.

    No schedule sends less: the block for rank j exists only here. Memory: read x once and write the
    output once (a kernel writing straight into the peers' outputs needs no send buffer).
    """
    w = ctx.world_size
    s = ctx.size
    nbytes = s["batch"] * s["seq"] * s["heads_local"] * s["head_dim"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(x, seq_dim, head_dim, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "VeOmni pads the sequence to a multiple of W before the exchange; here the world size must divide"
        " seq, so there is never padding (nor was there at the original's sizes: seq = 16 and 8 % W == "
        "0). The reference sends one buffer with all_to_all_single where the original passes lists of "
        "chunks to all_to_all."
    ),
}
