"""Problem 80 as DINOv2's code literally runs it: the patch count all-reduced in place. The assignment is
right, but the call changes its input n_masked_patches_tensor (to the sum over ranks): it must fail
as a mutated input."""

import torch
import torch.distributed as dist


def solution(teacher_output, teacher_temp, n_masked_patches_tensor, n_iterations=3, group=None):
    q = torch.exp(teacher_output.float() / teacher_temp).t()
    b = n_masked_patches_tensor
    dist.all_reduce(b, group=group)
    k = q.shape[0]
    sum_q = torch.sum(q)
    dist.all_reduce(sum_q, group=group)
    q /= sum_q
    for _ in range(n_iterations):
        sum_of_rows = torch.sum(q, dim=1, keepdim=True)
        dist.all_reduce(sum_of_rows, group=group)
        q /= sum_of_rows
        q /= k
        q /= torch.sum(q, dim=0, keepdim=True)
        q /= b
    q *= b
    return q.t().contiguous()
