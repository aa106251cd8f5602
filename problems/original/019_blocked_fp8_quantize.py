"""The original benchmark's problem 19, exactly: block FP8 quantization, then an all-gather.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds x
[1024, 1024] and is called as solution(x, 128). Each row is cut into blocks of 128 columns; a block's
scale is amax(|x|) / 448 in float32 and its codes are x / scale rounded to float8_e4m3fn. Every rank
returns the same tuple, in the original's order: the codes of all ranks float8_e4m3fn
[W * 1024, 1024] and their scales float32 [W * 1024, 8], rank r's in rows r * 1024 .. (r + 1) * 1024.
Judged as the original harness judges: atol = rtol = 1e-2 on the values as float32, no norm bound;
the inputs are drawn from secret seeds (pkb's, docs/variants.md). The original's reference is a
Triton kernel; ours computes the same in torch.

With standard normal inputs every scale is about 0.006, so the scales' bound is mostly the atol of
1e-2: a scale off by a factor of two would pass. The codes are judged at one part in a hundred,
less than one FP8 step (1/8), so a code that rounds the other way fails: multiplying by the
reciprocal of the scale instead of dividing by it flips about 0.05% of the codes (1089 of 2 M at
W = 2 on CPU) and fails.
"""

import math

import torch
import torch.distributed as dist

ID = 19
NAME = "blocked_fp8_quantize"
CATEGORY = "comm-compression"
SOURCE = "DeepSeek-V3 block FP8 quantization (1 x 128 activation tiles)"
SUMMARY = "Quantize bf16 [1024, 1024] to FP8 per 1x128 block, all-gather codes and scales (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024, "block": 128}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
FP8_MAX = 448.0


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: x standard normal; blocks of 128."""
    s = ctx.size
    return ctx.randn(s["rows"], s["cols"]), s["block"]


def solution(local_tensor, block_size=128):
    w = dist.get_world_size()
    *lead, cols = local_tensor.shape
    blocks = local_tensor.to(torch.float32).reshape(*lead, cols // block_size, block_size)
    scales = blocks.abs().amax(dim=-1) / FP8_MAX
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    codes = (blocks / safe.unsqueeze(-1)).to(torch.float8_e4m3fn).reshape(local_tensor.shape)
    # FP8 travels as raw bytes: collectives need not know the dtype
    all_codes = codes.new_empty(w * codes.shape[0], *codes.shape[1:])
    all_scales = scales.new_empty(w * scales.shape[0], *scales.shape[1:])
    dist.all_gather(list(all_codes.view(torch.uint8).chunk(w)), codes.view(torch.uint8))
    dist.all_gather(list(all_scales.chunk(w)), scales)
    return all_codes, all_scales


def traffic(ctx):
    """Per GPU: its FP8 codes (a byte each) and float32 scales go to each of the W - 1 peers."""
    s, w = ctx.size, ctx.world_size
    elems = s["rows"] * s["cols"]
    shard = elems + elems // s["block"] * 4
    return {
        "nvlink_bytes": (w - 1) * shard,
        "hbm_bytes": elems * ctx.dtype.itemsize + w * shard,
        "flops": 3 * elems,
        "rounds": 1,
    }
