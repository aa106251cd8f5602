"""Problem 19, correct another way: scales as amax * (1/448) and codes as x * (448 / amax).

Multiplying by reciprocals instead of dividing moves a scale by a float32 unit and flips a code by
one FP8 step wherever x / scale sits near a rounding midpoint (the contract allows both). Expected:
pass, within each output's bounds.
"""

import torch
import torch.distributed as dist

BLOCK = 128


def solution(x):
    world_size = dist.get_world_size()
    rows, cols = x.shape
    blocks = x.to(torch.float32).view(rows, cols // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    scales = amax * (1.0 / 448.0)
    codes = (blocks * (448.0 / amax).unsqueeze(-1)).to(torch.float8_e4m3fn).view(rows, cols)
    all_scales = scales.new_empty(world_size * rows, cols // BLOCK)
    all_codes = codes.new_empty(world_size * rows, cols)
    dist.all_gather_into_tensor(all_codes.view(torch.uint8), codes.view(torch.uint8))
    dist.all_gather_into_tensor(all_scales, scales)
    return all_scales, all_codes
