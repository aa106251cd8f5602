import torch
import torch.distributed as dist
from torch import Tensor


def solution(rs_input_1d: Tensor, gamma: Tensor, eps: float) -> Tensor:
    w, hidden = dist.get_world_size(), gamma.numel()
    rows = rs_input_1d.view(-1, hidden)
    out = rows.new_empty(rows.shape[0] // w, hidden)
    dist.reduce_scatter_tensor(out, rows)
    x = out.float() / w  # the average over the ranks
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gamma.float()
    return y.to(rs_input_1d.dtype)
