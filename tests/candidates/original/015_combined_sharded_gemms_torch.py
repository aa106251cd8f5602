import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(x_local: torch.Tensor, W1: torch.Tensor, W2: torch.Tensor) -> torch.Tensor:
    w, r = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x_local) for _ in range(w)]
    dist.all_gather(parts, x_local)
    y = F.silu(torch.cat(parts, dim=1) @ W1) @ W2
    rows = y.shape[0] // w
    out = y.new_empty(rows, y.shape[1])
    dist.reduce_scatter_tensor(out, y[r * rows : (r + 1) * rows].repeat(w, 1) / w)
    return out
