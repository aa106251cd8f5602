"""The original benchmark's problem 30, exactly: the LoRA gradients of an EP group GEMM, summed over ranks.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds the
gradients of two LoRA A matrices [8, 1024] and of a LoRA B matrix [1024, 8] (LoRA rank 8) and is
called as solution(grad_fc1_1, grad_fc1_2, grad_fc2, None). Each rank all-reduces the three in
place, in bf16, over the world and returns them: every rank returns the three sums, which are also
its inputs after the call (`MUTATES_INPUTS`: the inputs are judged too, following the returned
outputs, so a solution that returns new tensors must also leave the sums in its inputs). Judged as
the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret
seeds (pkb's, docs/variants.md).
"""

import math

import torch.distributed as dist

ID = 30
NAME = "moe_epgroupgemm_lora_backward"
CATEGORY = "EP/DP"
SOURCE = "VeOmni expert-parallel group GEMM with LoRA (gradient all-reduce)"
SUMMARY = "All-reduce three bf16 LoRA gradients ([8, 1024], [8, 1024], [1024, 8]) in place (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"lora_rank": 8, "hidden": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
MUTATES_INPUTS = True  # the original all-reduces its inputs in place and returns them


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: three standard normal gradients, group None (the world)."""
    r, h = ctx.size["lora_rank"], ctx.size["hidden"]
    return ctx.randn(r, h), ctx.randn(r, h), ctx.randn(h, r), None


def solution(grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B, group=None):
    group = group or dist.group.WORLD
    grads = (grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B)
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=group)
    return grads


def traffic(ctx):
    """Per GPU: a ring all-reduce of the three gradients together, 2 (W - 1) / W of their bytes
    each way; read and written once."""
    w = ctx.world_size
    nbytes = 3 * ctx.size["lora_rank"] * ctx.size["hidden"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * nbytes,
        "hbm_bytes": 2 * nbytes,
        "flops": (w - 1) * nbytes // ctx.dtype.itemsize,
        "rounds": 2,
    }
