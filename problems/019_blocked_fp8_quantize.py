"""Block-wise FP8 quantization of activations, then an all-gather of the FP8 payload and its scales.

Each rank holds a bf16 activation matrix x [rows, cols] (rows are tokens). Every row is cut into
blocks of 128 consecutive columns (the 1 x 128 tiles that DeepSeek-V3 uses for activations). For each
block, scale = amax(|x_block|) / 448 in float32 (448 is the largest float8_e4m3fn value), and the
payload is x / scale rounded to float8_e4m3fn (round to nearest even). The quantized matrices of all
ranks are then gathered, rank order, as communication-compressed activations are before an
expert-parallel or sequence-parallel GEMM. Every rank returns the same tuple:

  scales  float32 [W * rows, cols / 128]   rank r's scales in rows r*rows .. (r+1)*rows
  payload float8_e4m3fn [W * rows, cols]   rank r's codes in the same rows

The contract on the payload is "within one FP8 step". A correct kernel may compute x / scale with a
reciprocal or an approximate division, or as x * (448 / amax); whenever x / scale lands within a
few float32 units of a rounding midpoint between two FP8 values, that flips the code by one step
(measured: about 0.1% of the codes for bf16 inputs, where exact midpoints are common). Those flips
are allowed; a wrong block shape, a wrong FP8 maximum or quantizing with a scale half a percent off
is not, nor is a scale off by more than a few float32 units (see TOLERANCE).

Source: DeepSeek-V3 block FP8 quantization, a Triton kernel (ParallelKernelBench problem 19). Unlike
the original, each row of x has its own random magnitude (so block scales differ and are O(1), which a
relative tolerance can judge), and the scales come first in the output tuple.
"""

import torch
import torch.distributed as dist

ID = 19
NAME = "blocked_fp8_quantize"
CATEGORY = "comm-compression"
SOURCE = "DeepSeek-V3 block FP8 quantization (1 x 128 activation tiles)"
SUMMARY = "Quantize bf16 [rows, cols] to FP8 e4m3 per 1x128 block, all-gather codes and f32 scales."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (cols must be a multiple of 128)"
SIZES = {
    # rows, cols: this rank's activation matrix; the outputs have W * rows rows
    "pkb": {"rows": 1024, "cols": 1024},
    "large": {"rows": 16384, "cols": 8192},
}
BLOCK = 128
FP8_MAX = 448.0
# Each output on its own bounds (together, the codes, up to 448, hid scales 10% off).
# Codes: one FP8 e4m3 step is at most 1/8 of the value it rounds from (3 mantissa bits), and 2^-9
# below the smallest normal: rtol 1/8 and atol 2^-9 let every code move by one step where rounding
# differs. Their relative norm is 0.0027 for the reciprocal variant (tests/candidates/legit/
# 019_reciprocal.py; bench/scripts/tolerance_study.py, W = 2 and 4) and about 0.02 for scales 0.5%
# off, which move a large share of the codes by a step.
# Scales (output 0): amax / 448 in float32; a reciprocal or an approximate division moves a scale
# by a float32 unit or two (measured: 1.2e-7 relative at most, relative norm 6e-8), so 2e-6 is a
# margin of more than 10x and any scale that is off by more than that fails.
TOLERANCE = {
    "atol": 2.0**-9,
    "rtol": 0.125,
    "rel_norm": 0.01,
    "outputs": {0: {"atol": 0.0, "rtol": 2e-6, "rel_norm": 2e-6}},
}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
    """x [rows, cols]: normal values times a per-row magnitude uniform in [64, 1024).

    The magnitudes put every block's scale between about 0.3 and 7, so scales are judged relatively,
    and differ per row, so a single per-tensor scale is far off.
    """
    rows, cols = ctx.size["rows"], ctx.size["cols"]
    values = ctx.randn(rows, cols, dtype=torch.float32)
    magnitude = ctx.rand(rows, 1, low=64.0, high=1024.0, dtype=torch.float32)
    return ((values * magnitude).to(ctx.dtype),)


def solution(x):
    world_size = dist.get_world_size()
    rows, cols = x.shape
    blocks = x.to(torch.float32, copy=True).view(rows, cols // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=-1).div_(FP8_MAX)
    codes = blocks.div_(scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(rows, cols)

    all_scales = scales.new_empty(world_size * rows, cols // BLOCK)
    all_codes = codes.new_empty(world_size * rows, cols)
    # FP8 travels as raw bytes: collectives need not know the dtype
    _all_gather(all_codes.view(torch.uint8), codes.view(torch.uint8))
    _all_gather(all_scales, scales)
    return all_scales, all_codes


def traffic(ctx):
    """Per GPU: its FP8 codes (1 byte per element) and float32 scales go to each of the W-1 peers.

    HBM: read x once (bf16) and write the gathered codes and scales once; amax, divide and round are
    a few operations per element.
    """
    w = ctx.world_size
    elems = ctx.size["rows"] * ctx.size["cols"]
    shard = elems + elems // BLOCK * 4  # FP8 codes plus one float32 scale per block
    return {
        "nvlink_bytes": (w - 1) * shard,
        "hbm_bytes": elems * ctx.dtype.itemsize + w * shard,
        "flops": 3 * elems,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(local_tensor: torch.Tensor, block_size: int = 128) -> Tuple[torch.Tensor, torch.Tensor]"
    ),
    "args": lambda inputs, env: (inputs[0], BLOCK),
    "outputs": lambda out, args, env: (out[1], out[0]),  # the original's (codes, scales) in our order
    "differences": "The original returns (codes, scales); ours has the scales first: the harness swaps them.",
}
