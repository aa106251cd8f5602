"""A wrong solution of problem 71: each chunk convolved on its own (zeros before it), no halo exchange.
Only the first k-1 outputs of each chunk are wrong (6 of 1024 at `pkb`): they must fail."""

import torch
import torch.nn.functional as F


def solution(x, weight, group=None):
    k = weight.shape[-1]
    chunk = x.shape[-1] // 2
    halves = [F.conv1d(F.pad(h, (k - 1, 0)), weight, groups=x.shape[1]) for h in x.split(chunk, dim=-1)]
    return torch.cat(halves, dim=-1)
