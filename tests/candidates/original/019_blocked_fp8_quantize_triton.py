from typing import Tuple

import torch
import torch.distributed as dist


def _gather(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.cat(parts)


def solution(local_tensor: torch.Tensor, block_size: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    rows, cols = local_tensor.shape
    blocks = local_tensor.float().view(rows, cols // block_size, block_size)
    s = blocks.abs().amax(dim=-1) / 448.0
    y = (blocks / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(rows, cols)
    codes = _gather(y.view(torch.uint8)).view(torch.float8_e4m3fn)
    return codes, _gather(s)  # (codes, scales), the original's order
