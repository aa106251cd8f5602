"""Problem 86, correct another way: all-gather the bf16 momentum once, iterate on the whole matrix
locally with the Gram on its short side (X^T X when the gathered matrix is tall, X X^T when it is
wide), keep this rank's columns. No communication inside the iteration (the original's "duplicated" mode).

Expected: pass. X (b A + c A A) with A = X X^T equals (b B + c B B) applied from the right with
B = X^T X, so only rounding differs.
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
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(x) for _ in range(w)]
    dist.all_gather(parts, x.contiguous(), group=group)
    X = torch.cat(parts, dim=1).float()
    rows, cols = X.shape
    X = X / X.square().sum().sqrt().clamp_min(1e-7)
    tall = rows > cols
    for step in range(steps):
        a, b, c = QUINTIC[step % len(QUINTIC)]
        if tall:  # X (b B + c B B) with B = X^T X [cols, cols]
            gram = X.T @ X
            X = a * X + X @ (b * gram + c * gram @ gram)
        else:
            gram = X @ X.T
            X = a * X + (b * gram + c * gram @ gram) @ X
    n = x.shape[1]
    out = X[:, rank * n : (rank + 1) * n] * math.sqrt(max(rows, cols))
    return out.to(torch.bfloat16).contiguous()
