"""Problem 63 written the way the original benchmark's file is (its convention, our own code): the
LKF step with H^T P H summed block by block, an all-reduce, the weights and P updated by the
textbook formulas (three passes over P), the weights' lengths exchanged with all_gather_object and
the weights with an all_gather of lists."""

import torch
import torch.distributed as dist


@torch.no_grad()
def solution(
    H: list[torch.Tensor],
    error: torch.Tensor,
    weights: list[torch.Tensor],
    P: list[torch.Tensor],
    kalman_lambda: float,
    kalman_nue: float = 0.9987,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    device, dtype = weights[0].device, weights[0].dtype
    lam = torch.tensor(kalman_lambda, dtype=dtype, device=device)
    total = torch.zeros(1, 1, dtype=dtype, device=device)
    for h, p in zip(H, P, strict=True):
        total = total + lam + h.t().matmul(p).matmul(h)
    dist.all_reduce(total)
    a = 1.0 / total
    err = error.to(dtype)
    for i in range(len(weights)):
        k = P[i].matmul(H[i])
        weights[i] = weights[i] + a * err * k
        P[i] = (P[i] - a * k.matmul(k.t())) / lam
    lengths: list = [None] * dist.get_world_size()
    dist.all_gather_object(lengths, [w.shape[0] for w in weights])
    flat = torch.cat([w.reshape(-1) for w in weights])
    parts = [flat.new_empty(sum(n)) for n in lengths]
    dist.all_gather(parts, flat)
    gathered = [t.reshape(-1, 1) for part, n in zip(parts, lengths, strict=True) for t in part.split(n)]
    lam_next = kalman_nue * lam + 1 - kalman_nue
    return gathered, P, lam_next
