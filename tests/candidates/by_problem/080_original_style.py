"""Problem 80 written as a file for the original benchmark would be (our own code): DINOv2's
sinkhorn_knopp_teacher step by step in float32 (Q as K x n, two divisions per normalization, five
all-reduces), called with the original's (teacher_output, teacher_temp, n_masked, 3, None). It copies
the patch count before all-reducing it, and must pass unchanged.
"""

import torch
import torch.distributed as dist


def solution(teacher_output, teacher_temp, n_masked_patches_tensor, n_iterations=3, group=None):
    teacher_output = teacher_output.float()
    q = torch.exp(teacher_output / teacher_temp).t()
    b = n_masked_patches_tensor.clone()
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
    return q.t()
