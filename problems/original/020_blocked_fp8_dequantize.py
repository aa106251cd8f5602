"""The original benchmark's problem 20, exactly: block dequantization, then an all-to-all.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds
local_y [W, 1024, 1024] and local_s [W, 1024 * 1024 / 128], one scale per block of 128 consecutive
elements, and is called as solution(local_y, local_s, 128). It dequantizes every block in float32
(x = y * s, neither is fp8 in the original's inputs) and sends chunk d of x to rank d: rank r
returns [W, 1024, 1024] float32 whose chunk s is rank s's chunk r. Judged as the original harness
judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md). The original's reference is a Triton kernel; ours computes the same in torch.

The `pkb` variant (fp8 values and float32 scales, as DeepSeek-V3 has them) was redesigned for this.
"""

import math

import torch
import torch.distributed as dist

ID = 20
NAME = "blocked_fp8_dequantize"
CATEGORY = "EP"
SOURCE = "DeepSeek-V3 block FP8 dequantization with expert-parallel all-to-all"
SUMMARY = "Dequantize bf16 blocks of 128 by their scales into float32 [W, 1024, 1024], then all-to-all."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024, "block": 128}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: W chunks of values and one scale per block, standard normal bf16."""
    s, w = ctx.size, ctx.world_size
    blocks = s["rows"] * s["cols"] // s["block"]
    return ctx.randn(w, s["rows"], s["cols"]), ctx.randn(w, blocks), s["block"]


def solution(local_y, local_s, block_size=128):
    w = local_y.shape[0]
    x = local_y.to(torch.float32).view(w, -1, block_size) * local_s.to(torch.float32).view(w, -1, 1)
    out = torch.empty_like(x.view(local_y.shape))
    dist.all_to_all_single(out, x.view(local_y.shape))
    return out


def traffic(ctx):
    """Per GPU, the least: send W - 1 chunks as they arrive (bf16 values and their scales) and
    dequantize on the receiver; float32 written once."""
    s, w = ctx.size, ctx.world_size
    chunk = s["rows"] * s["cols"]
    scales = chunk // s["block"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * (chunk + scales) * isz,
        "hbm_bytes": w * (chunk + scales) * isz + w * chunk * 4,
        "flops": w * chunk,
        "rounds": 1,
    }
