"""The original benchmark's problem 76, exactly: a channel-parallel 3-D convolution, then an all-reduce.

As the original's input builder makes them (a seed per rank): the layer has C = 512 output channels
(256 or 128 where W does not divide 512: the first that W divides) and C input channels split over
the ranks; rank r holds input [1, C / W, 19, 66, 66] and its kernel slice weight [C, C / W, 3, 3, 3],
bf16 standard normal (unscaled: outputs of standard deviation about 120), and the bias
linspace(-0.1, 0.1, C) in bf16, the same on every rank. Called as solution(input, weight, bias, 1,
0, 1, 1, None): each rank convolves its slice (no bias) into bf16 [1, C, 17, 64, 64], all-reduces
the partials in bf16 and adds the bias; every rank returns the sum. Judged as the original harness
judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).

On CPU (the tests' machine: 2 cores) one call at the original's size takes minutes (0.5 TFLOP per
rank at W = 2), so on a CPU device the input is cpu_frames x cpu_height x cpu_width (5 x 8 x 8)
instead: the same channels and kernel.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 76
NAME = "opensora_conv3d_allreduce"
CATEGORY = "TP (channels)"
SOURCE = "Open-Sora VAE channel-parallel Conv3d"
SUMMARY = "Conv3d of bf16 [1, 512/W, 19, 66, 66] channel slices (unscaled weights), bf16 all-reduce."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing 512, 256 or 128 (the channels are the first it divides)"
SIZES = {
    "pkb": {
        "channel_choices": [512, 256, 128],
        "frames": 19,
        "height": 66,
        "width": 66,
        "cpu_frames": 5,
        "cpu_height": 8,
        "cpu_width": 8,
    }
}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
KERNEL = 3


def channels(world_size, size):
    """The original's C: the first of its choices that the world size divides, else the first."""
    return next((c for c in size["channel_choices"] if c % world_size == 0), size["channel_choices"][0])


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if channels(world_size, size) % world_size:
        return f"the world size {world_size} divides none of {size['channel_choices']}"
    return None


def volume(ctx):
    """The input's frames, height and width (the reduced ones on a CPU device)."""
    prefix = "cpu_" if ctx.device.type == "cpu" else ""
    return tuple(ctx.size[prefix + key] for key in ("frames", "height", "width"))


def make_inputs(ctx):
    """The original's: this rank's input channels and kernel slice, standard normal; the bias its
    linspace; stride 1, padding 0, dilation 1, one group, group None."""
    c = channels(ctx.world_size, ctx.size)
    c_local = c // ctx.world_size
    x = ctx.randn(1, c_local, *volume(ctx))
    weight = ctx.randn(c, c_local, KERNEL, KERNEL, KERNEL)
    bias = torch.linspace(-0.1, 0.1, c, dtype=ctx.dtype, device=ctx.device)
    return x, weight, bias, 1, 0, 1, 1, None


@torch.no_grad()
def solution(input, weight, bias, stride, padding, dilation, groups=1, group=None):
    out = F.conv3d(input, weight, None, stride, padding, dilation, groups)
    dist.all_reduce(out, group=group)
    return out + bias.view(1, -1, 1, 1, 1) if bias is not None else out


def traffic(ctx):
    """Per GPU, the least: reducing the partial outputs (2 (W-1)/W of the output) or gathering every
    rank's input and kernel slices ((W-1) of them) and convolving everything locally. FLOPs: this
    rank's partial convolution and the reduction's adds; HBM: the slices and the bias read, the
    output written."""
    w = ctx.world_size
    c = channels(w, ctx.size)
    isz = ctx.dtype.itemsize
    frames, height, width = volume(ctx)
    out_voxels = (frames - KERNEL + 1) * (height - KERNEL + 1) * (width - KERNEL + 1)
    c_local = c // w
    x_local = c_local * frames * height * width
    w_local = c * c_local * KERNEL**3
    out_elems = c * out_voxels
    return {
        "nvlink_bytes": min(2 * (w - 1) / w * out_elems * isz, (w - 1) * (x_local + w_local) * isz),
        "hbm_bytes": (x_local + w_local + c + out_elems) * isz,
        "flops": 2 * c * c_local * KERNEL**3 * out_voxels + (w - 1) / w * out_elems,
        "rounds": 1,
    }
