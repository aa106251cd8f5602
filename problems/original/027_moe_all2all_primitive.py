"""The original benchmark's problem 27, exactly: an all-to-all of token rows with split-size lists.

As the original's input builder makes them (a seed per rank): rank r holds local_tensor bf16
[1024, 1024], N(0, 1), and input_split_sizes = [1024 // W] * W (the remainder, if any, added to the
last), passes the same list as output_split_sizes, and is called as solution(local_tensor,
input_split_sizes, output_split_sizes, None). Every rank returns the rows each rank sent it, rank 0's
first: bf16 [1024, 1024], an even all-to-all.

The builder's lists are consistent only where W divides 1024 (elsewhere the last rank would receive
more rows than the others' output lists say), so the world size must divide 1024.

Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the rows are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch.distributed as dist

ID = 27
NAME = "moe_all2all_primitive"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM EP all-to-all primitive (all_to_all_single with split sizes)"
SUMMARY = "All-to-all of bf16 rows [1024, 1024] with even split-size lists (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing tokens (1024)"
SIZES = {"pkb": {"tokens": 1024, "hidden": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["tokens"] % world_size:
        return f"tokens = {size['tokens']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: N(0, 1) rows, even splits, the same list for input and output."""
    t, w = ctx.size["tokens"], ctx.world_size
    splits = [t // w] * w
    splits[-1] += t % w
    return ctx.randn(t, ctx.size["hidden"]), splits, list(splits), None


def solution(local_tensor, input_split_sizes=None, output_split_sizes=None, group=None):
    group = group or dist.group.WORLD
    local_tensor = local_tensor.contiguous()
    if output_split_sizes is None:
        rows = local_tensor.shape[0]
    elif isinstance(output_split_sizes, list):
        rows = sum(output_split_sizes)
    else:
        rows = int(output_split_sizes.sum().item())
    output = local_tensor.new_empty(rows, local_tensor.shape[1])
    dist.all_to_all_single(
        output,
        local_tensor,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    return output


def traffic(ctx):
    """Per GPU, the least: the (W-1)/W of the rows bound for peers leave once; read and write once."""
    t, h, w = ctx.size["tokens"], ctx.size["hidden"], ctx.world_size
    row = h * ctx.dtype.itemsize
    return {"nvlink_bytes": (t - t // w) * row, "hbm_bytes": 2 * t * row, "flops": 0, "rounds": 1}
