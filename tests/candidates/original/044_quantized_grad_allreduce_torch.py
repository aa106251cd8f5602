import torch
import torch.distributed as dist
from torch import Tensor


def solution(flat_grad: Tensor, block_size: int) -> Tensor:
    blocks = flat_grad.float().view(-1, block_size)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127.0
    codes = torch.round(blocks / scale).clamp_(-127, 127).to(torch.int8)
    values = (codes.float() * scale).view(-1)  # dequantized locally, then averaged in float32
    dist.all_reduce(values)
    return values.div_(dist.get_world_size()).to(flat_grad.dtype)
