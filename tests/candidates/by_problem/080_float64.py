"""Problem 80 in float64, DINOv2's steps one by one: an independent correct solution (the tolerance's
basis), rounded to float32 at the end. Clones the count before all-reducing it."""

import torch
import torch.distributed as dist


def solution(teacher_output, teacher_temp, n_masked_patches_tensor, n_iterations=3, group=None):
    q = torch.exp(teacher_output.double() / teacher_temp).t()  # [K, n], as DINOv2 writes it
    total = n_masked_patches_tensor.clone()
    dist.all_reduce(total, group=group)
    n_total = total.double()
    k = q.shape[0]
    s = q.sum()
    dist.all_reduce(s, group=group)
    q = q / s
    for _ in range(n_iterations):
        rows = q.sum(dim=1, keepdim=True)
        dist.all_reduce(rows, group=group)
        q = q / rows / k
        q = q / q.sum(dim=0, keepdim=True) / n_total
    return (q * n_total).t().float().contiguous()
