"""Problem 76 written plainly in the original's convention: each rank convolves its input channels
without the bias, the partial outputs are all-reduced in bf16 and the bias is added afterwards on
every rank. Called as the original harness calls it: (x, weight, bias, 1, 0, 1, 1, None)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int | tuple[int, int, int],
    padding: int | tuple[int, int, int],
    dilation: int | tuple[int, int, int],
    groups: int = 1,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    out = F.conv3d(input, weight, None, stride, padding, dilation, groups)
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1, 1)
    return out
