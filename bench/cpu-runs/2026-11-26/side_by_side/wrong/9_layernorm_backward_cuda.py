# deliberately wrong: d_beta and d_gamma returned in each other's place
import torch
import torch.distributed as dist


@torch.no_grad()
def solution(X_hat, dY):
    d_beta = dY.sum(dim=0)
    d_gamma = (dY * X_hat).sum(dim=0)
    dist.all_reduce(d_beta)
    dist.all_reduce(d_gamma)
    return d_beta, d_gamma
