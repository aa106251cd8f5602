"""All-reduces in place into its input and returns a copy: right values, changed inputs.

Saves the output allocation of the reference by destroying the caller's gradient. The harness
snapshots the inputs before the call and compares after. Expected: fail, every rank `wrong`
("input 0 was changed").
"""

import torch.distributed as dist


def solution(x):
    dist.all_reduce(x)
    return x.clone()
