import torch
import torch.distributed as dist


def solution(local_y: torch.Tensor, local_s: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    w, rows, cols = local_y.shape
    values = local_y.float().view(w, -1, block_size) * local_s.float().view(w, -1, 1)
    out = torch.empty_like(values)
    dist.all_to_all_single(out, values)
    return out.view(w, rows, cols)
