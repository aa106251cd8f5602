"""The original benchmark's problem 37, exactly: Ulysses' all-to-all from head shards back to sequence shards.

As the original's input builder makes it (random normal bf16, a seed per rank): rank r holds x
[16, 16, 8, 64] (batch, sequence 16, its 8 heads, head dimension 64) and is called as
solution(x, 1, 2, None). Each rank splits x into W pieces along the sequence (dimension 1; 16 is a
multiple of W, so no padding), sends piece d to rank d, and returns the pieces it receives side by
side along the heads (dimension 2) in rank order: [16, 16 / W, 8 W, 64]. Judged as the original
harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 37
NAME = "ulysses_gather_heads_scatter_seq"
CATEGORY = "Ulysses"
SOURCE = "VeOmni Ulysses sequence parallelism (gather_heads_scatter_seq)"
SUMMARY = "All-to-all bf16 [16, 16, 8, 64] from head shards to sequence shards (the original's call)."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing 8 (the original's builder asks it of its 8 heads): 2, 4 or 8"
SIZES = {"pkb": {"batch": 16, "seq": 16, "heads_local": 8, "head_dim": 64}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["heads_local"] % world_size:
        return f"heads = {size['heads_local']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: x standard normal; sequence dimension 1, heads 2, group None."""
    s = ctx.size
    return ctx.randn(s["batch"], s["seq"], s["heads_local"], s["head_dim"]), 1, 2, None


def _all_to_all(x, scatter_dim, gather_dim, group):
    w = dist.get_world_size(group)
    # the pieces side by side in one buffer, exchanged by one all_to_all_single
    send = torch.stack([p.contiguous() for p in torch.tensor_split(x, w, scatter_dim)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(list(recv.unbind(0)), dim=gather_dim)


def solution(x, seq_dim, head_dim, group=None):
    group = group or dist.group.WORLD
    w = dist.get_world_size(group)
    if x.size(seq_dim) % w:  # zeros after the sequence, up to a multiple of W
        pad = list(x.shape)
        pad[seq_dim] = w - x.size(seq_dim) % w
        x = torch.cat([x, x.new_zeros(pad)], dim=seq_dim)
    return _all_to_all(x, seq_dim, head_dim, group)


def traffic(ctx):
    """Per GPU: every sequence block but its own goes to the rank that owns those positions,
    (W - 1) / W of x; x read once, the output written once."""
    s, w = ctx.size, ctx.world_size
    nbytes = s["batch"] * s["seq"] * s["heads_local"] * s["head_dim"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) / w * nbytes, "hbm_bytes": 2 * nbytes, "flops": 0, "rounds": 1}
