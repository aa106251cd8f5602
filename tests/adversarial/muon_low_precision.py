"""Problem 86 in lower precision than the contract: the Gram all-reduced and the iteration's GEMMs
run in bf16 (half the bytes on the wire, tensor cores), state rounded to bf16 after every step.

The contract is float32 throughout. Expected: fail, every rank `wrong` (the relative error norm is
about 30 times the bound).
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
    full_cols = dist.get_world_size(group) * x.shape[1]
    sum_sq = x.float().square().sum()
    dist.all_reduce(sum_sq, group=group)
    X = (x.float() / sum_sq.sqrt().clamp_min(1e-7)).to(torch.bfloat16)
    for step in range(steps):
        a, b, c = QUINTIC[step % len(QUINTIC)]
        gram = X @ X.T
        dist.all_reduce(gram, group=group)
        X = a * X + (b * gram + c * gram @ gram) @ X
    return (X.float() * math.sqrt(max(X.shape[0], full_cols))).to(torch.bfloat16)
