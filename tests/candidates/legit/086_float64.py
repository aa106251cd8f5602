"""Problem 86, correct another way: the reference's schedule (a Gram all-reduce a step) in float64.

Expected: pass: float64 is at least as precise as the float32 contract.
"""

import math

import torch
import torch.distributed as dist

QUINTIC = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)


def solution(x, steps=5, coefficient_type="quintic", partition_dim=1, group=None):
    assert coefficient_type == "quintic" and partition_dim == 1
    X = x.double()
    full_cols = dist.get_world_size(group) * X.shape[1]
    sum_sq = X.square().sum()
    dist.all_reduce(sum_sq, group=group)
    X = X / sum_sq.sqrt().clamp_min(1e-7)
    for step in range(steps):
        a, b, c = QUINTIC[step % len(QUINTIC)]
        gram = X @ X.T
        dist.all_reduce(gram, group=group)
        X = a * X + (b * gram + c * gram @ gram) @ X
    return (X * math.sqrt(max(X.shape[0], full_cols))).to(torch.bfloat16)
