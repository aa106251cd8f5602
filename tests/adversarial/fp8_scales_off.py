"""Problem 19: every FP8 code right, every block scale 10% too large (issue 17).

The codes (up to 448) outweigh the scales (O(1)) so much that a relative norm over both outputs
together stayed below 0.01 and this passed. Each output on its own bounds, the scales are 10% off
their own norm. Expected: fail, every rank `wrong`, at output 0 (the scales).
"""

import torch
import torch.distributed as dist

BLOCK = 128
FP8_MAX = 448.0


def solution(x):
    world_size = dist.get_world_size()
    rows, cols = x.shape
    blocks = x.to(torch.float32, copy=True).view(rows, cols // BLOCK, BLOCK)
    scales = blocks.abs().amax(dim=-1).div_(FP8_MAX)
    codes = blocks.div_(scales.unsqueeze(-1)).to(torch.float8_e4m3fn).view(rows, cols)
    scales = scales * 1.1  # the lie: only in the small output
    all_scales = scales.new_empty(world_size * rows, cols // BLOCK)
    all_codes = codes.new_empty(world_size * rows, cols)
    dist.all_gather_into_tensor(all_codes.view(torch.uint8), codes.view(torch.uint8))
    dist.all_gather_into_tensor(all_scales, scales)
    return all_scales, all_codes
