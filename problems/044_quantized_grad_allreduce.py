"""All-reduce of bf16 gradients whose contributions are int8 block-quantized before they travel.

Each rank holds a flat bf16 gradient g [n]. Every rank quantizes its own gradient once, in blocks of
128 consecutive elements: scale = amax(|g_block|) / 127 in float32, code = round(g / scale), an int8
in [-127, 127]. Every rank must return, in bf16, the mean over ranks of the dequantized gradients,
(sum_r code_r * scale_r) / W, accumulated in float32 and rounded to bf16 once: [n].

This is the contract, exactly: each rank's contribution is quantized once, at its source, and
nothing else is lossy. The point is to move int8 codes instead of bf16 or float32 values, as
ZeRO++'s quantized gradient communication does. The reference all-to-alls the codes and scales (each
rank receives its 1/W of every rank's blocks), sums them in float32, divides by W, rounds to bf16
and all-gathers the bf16 means. Skipping the quantization, or quantizing the partial sums a second
time, is a different computation and fails (see TOLERANCE).

Source: int8 block quantization + all-reduce in the style of ZeRO++ (ParallelKernelBench problem 44).
The sizes (n = 2^20, blocks of 128), the standard normal gradients and the mean are the original's.

Differences from the original: the original dequantizes each contribution locally and all-reduces the
float32 values, so nothing is compressed on the wire; that is the same mean, which is what is judged
(the point here is to send int8 codes instead). The original also clamps each block's scale to at
least 1e-8 / 127, which only an all-zero block would reach, and random gradients have none.
"""

import torch
import torch.distributed as dist

ID = 44
NAME = "quantized_grad_allreduce"
CATEGORY = "DP"
SOURCE = "ZeRO++-style int8 quantized gradient communication (DeepSpeed)"
SUMMARY = "All-reduce bf16 [n] gradients quantized to int8 per 128-block at each rank; f32 mean, bf16 out."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 with 128 * W dividing n"
SIZES = {
    "pkb": {"n": 1048576},
    "large": {"n": 134217728},
}
BLOCK = 128
INT8_MAX = 127.0
# Outputs are O(1/sqrt(W)). Legitimate variants (x * (127 / amax) instead of x / scale, ties rounded
# away from zero instead of to even, another float32 summation order) change a code by one step where
# g / scale sits at a rounding midpoint, which bf16 inputs make common (up to 1% of elements): one
# step moves the mean by amax / (127 W) <= 0.02 here, within atol; rtol covers the final bf16
# rounding. Measured relative norms (with the sum, which the mean only scales): <= 0.0008 for those
# variants, 0.007 for an unquantized sum or a second quantization of the sums, 0.003-0.004 for a bf16
# accumulation; the bound sits between.
TOLERANCE = {"atol": 0.04, "rtol": 0.01, "rel_norm": 0.0025}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["n"] % (BLOCK * world_size):
        return f"n = {size['n']} does not split into {world_size} equal runs of {BLOCK}-element blocks"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): n a multiple of
    128 * W, so that every rank sums an equal run of whole blocks."""
    return {"n": draw("n", 65536, 1572864, 128 * world_size)}


def make_inputs(ctx):
    """g [n], standard normal as in the original (the mean over ranks is O(1/sqrt(W)))."""
    return (ctx.randn(ctx.size["n"]),)


def solution(grad):
    w = dist.get_world_size()
    n = grad.numel()
    # run d of the blocks is summed on rank d
    blocks = grad.to(torch.float32, copy=True).view(w, n // (w * BLOCK), BLOCK)
    scales = blocks.abs().amax(dim=-1, keepdim=True).div_(INT8_MAX)
    codes = blocks.div_(scales).round_().to(torch.int8)

    recv_codes = torch.empty_like(codes)
    recv_scales = torch.empty_like(scales)
    dist.all_to_all_single(recv_codes, codes)
    dist.all_to_all_single(recv_scales, scales)
    partial = recv_codes.float().mul_(recv_scales).sum(dim=0).div_(w).to(grad.dtype)

    out = grad.new_empty(n)
    _all_gather(out, partial.view(-1))
    return out


def traffic(ctx):
    """Per GPU: the cheaper of two schedules that keep the contract exact.

    Two steps: all-to-all of the int8 codes and float32 scales ((W-1)/W of them), then an all-gather of
    the bf16 means ((W-1)/W of n bf16 values). One step: every rank sends its codes and scales to every
    peer and sums all of them itself ((W-1) times the codes); cheaper at W = 2. HBM: read g and write
    the output once.
    """
    w, n = ctx.world_size, ctx.size["n"]
    packed = n + n // BLOCK * 4  # int8 codes plus one float32 scale per block
    two_step = (w - 1) / w * (packed + n * ctx.dtype.itemsize)
    one_step = (w - 1) * packed
    return {
        "nvlink_bytes": min(two_step, one_step),
        "hbm_bytes": 2 * n * ctx.dtype.itemsize,
        # amax, divide and round per element; then a multiply-add per element and contribution
        "flops": 3 * n + 2 * n,
        "rounds": 2 if two_step < one_step else 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(flat_grad: Tensor, block_size: int) -> Tensor",
    "args": lambda inputs, env: (inputs[0], BLOCK),
    "differences": (
        "the original dequantizes each contribution locally and all-reduces the float32 values, so "
        "nothing is compressed on the wire; that is the same mean, which is what is judged (the point "
        "here is to send int8 codes instead). The original also clamps each block's scale to at least "
        "1e-8 / 127, which only an all-zero block would reach, and random gradients have none."
    ),
}
