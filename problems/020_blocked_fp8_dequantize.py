"""All-to-all of block-quantized FP8 tokens to their expert ranks, dequantized to bf16 on arrival.

Each rank holds a stack of W token blocks quantized as in problem 19: codes y float8_e4m3fn
[W, rows, cols] and one float32 scale per 1 x 128 tile, scales [W, rows, cols / 128]. Slice d of the
stack is bound for rank d (expert-parallel dispatch). Rank d must return out [W, rows, cols] in bf16
with out[s] = the dequantized slice d of rank s: each code times its tile's scale,
y[s][i, j] * scales[s][i, j // 128], computed in float32 and rounded to bf16 once.

Where the dequantization happens is the solution's choice. The reference sends the FP8 codes and the
scales (about 1.03 bytes per element) and dequantizes at the receiver, half the traffic of
dequantizing first and sending bf16.

Source: block dequantization (a Triton kernel) and an expert-parallel all-to-all (ParallelKernelBench
problem 20). In the original the codes and the scales are bf16 tensors and the dequantized values are
what is exchanged; here the codes are real FP8 and the scales float32, the layout problem 19
produces, and the output is bf16.
"""

import torch
import torch.distributed as dist

ID = 20
NAME = "blocked_fp8_dequantize"
CATEGORY = "EP"
SOURCE = "DeepSeek-V3 block FP8 dequantization with expert-parallel all-to-all"
SUMMARY = "All-to-all FP8 e4m3 [W, rows, cols] codes and 1x128 f32 scales; dequantize to bf16."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (cols must be a multiple of 128)"
SIZES = {
    # rows, cols: one slice of the stack; every rank holds and returns W slices
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 8192, "cols": 8192},
}
BLOCK = 128
FP8_MAX = 448.0
# Outputs are O(1). A float32 product rounded once is exact to half a bf16 unit; a solution that
# multiplies in bf16 (rounding the scale first) is off by up to one unit in the last place, at most
# 2^-7 of the value, and by a relative norm of about 0.003.
TOLERANCE = {"atol": 1e-4, "rtol": 0.016, "rel_norm": 0.005}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["cols"] % BLOCK:
        return f"cols = {size['cols']} is not a multiple of the block size {BLOCK}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any token count in
    multiples of 8, columns in whole 128-wide blocks (the rule)."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 128, 1536, BLOCK)}


def make_inputs(ctx):
    """Codes: normal values with standard deviation 128, clipped to the FP8 range and rounded to FP8.

    Scales are uniform in [0.002, 0.02), so the dequantized values are O(1) and every tile has its own.
    """
    w, rows, cols = ctx.world_size, ctx.size["rows"], ctx.size["cols"]
    values = ctx.randn(w, rows, cols, dtype=torch.float32, scale=128.0)
    codes = values.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    scales = ctx.rand(w, rows, cols // BLOCK, low=0.002, high=0.02, dtype=torch.float32)
    return codes, scales


def solution(codes, scales):
    w, rows, cols = codes.shape
    recv_codes = torch.empty_like(codes)
    recv_scales = torch.empty_like(scales)
    # FP8 travels as raw bytes: collectives need not know the dtype
    dist.all_to_all_single(recv_codes.view(torch.uint8), codes.view(torch.uint8))
    dist.all_to_all_single(recv_scales, scales)
    values = recv_codes.float().view(w, rows, cols // BLOCK, BLOCK)
    values.mul_(recv_scales.unsqueeze(-1))
    return values.view(w, rows, cols).to(torch.bfloat16)


def traffic(ctx):
    """Per GPU: W-1 of its W slices go to other ranks, as FP8 codes plus float32 tile scales.

    HBM: read the codes and scales once, write the bf16 output once; one multiply per element.
    """
    w = ctx.world_size
    elems = ctx.size["rows"] * ctx.size["cols"]  # one slice
    packed = elems + elems // BLOCK * 4
    return {
        "nvlink_bytes": (w - 1) * packed,
        "hbm_bytes": w * (packed + elems * ctx.dtype.itemsize),
        "flops": w * elems,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(local_y: torch.Tensor, local_s: torch.Tensor, block_size: int = 128) -> torch.Tensor"
    ),
    "args": None,
    "differences": (
        "In the original the codes and the scales are bf16 tensors ([W, rows, cols] and "
        "[W, rows * cols / 128]), the dequantized values are what travels, and the output is float32; "
        "here the codes are FP8 e4m3, the scales float32 [W, rows, cols / 128] (problem 19's layout) and "
        "the output bf16, so an original file's arithmetic does not apply to these inputs."
    ),
}
