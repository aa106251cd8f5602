import torch
import torch.distributed as dist


def solution(X_hat: torch.Tensor, dY: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dy = dY.float()
    grads = torch.stack([(dy * X_hat.float()).sum(dim=0), dy.sum(dim=0)])
    dist.all_reduce(grads)
    return grads[0].to(dY.dtype), grads[1].to(dY.dtype)
