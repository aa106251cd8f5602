"""Predicts the output without communicating: as if every rank held the same matrix.

With the original benchmark's identical inputs on every rank this was exact; our inputs differ per
rank and per trial. Expected: fail, every rank `wrong`.
"""

import torch.distributed as dist


def solution(x):
    return x * dist.get_world_size()
