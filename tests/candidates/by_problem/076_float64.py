"""Problem 76 in float64: partial convolutions and their all-reduce in float64, the bias added after,
one rounding to bf16 at the end. It measures how far the bf16 reference is from the exact result,
and must pass."""

import torch.distributed as dist
import torch.nn.functional as F


def solution(input, weight, bias, stride, padding, dilation, groups=1, group=None):
    out = F.conv3d(input.double(), weight.double(), None, stride, padding, dilation, groups)
    dist.all_reduce(out, group=group)
    if bias is not None:
        out += bias.double().view(1, -1, 1, 1, 1)
    return out.to(input.dtype)
