from typing import Optional

import torch
import torch.distributed as dist

QUINTIC = [
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
]


def solution(
    x: torch.Tensor,
    steps: int = 5,
    coefficient_type: str = "quintic",
    partition_dim: int = 1,
    group: Optional[dist.ProcessGroup] = None,
) -> torch.Tensor:
    X = x.float() if partition_dim == 1 else x.float().T
    sum_sq = X.square().sum().reshape(1)
    dist.all_reduce(sum_sq, group=group)
    X = X / sum_sq.sqrt().clamp_min(1e-7)
    for i in range(steps):
        a, b, c = QUINTIC[i % len(QUINTIC)]
        A = X @ X.T
        dist.all_reduce(A, group=group)
        X = a * X + (b * A + c * A @ A) @ X
    out = X.to(x.dtype)
    return out if partition_dim == 1 else out.T.contiguous()
