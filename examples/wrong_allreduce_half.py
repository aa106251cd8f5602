"""A deliberately wrong solution for problem 1 (allreduce): only the first half of the rows is reduced.

The second half keeps this rank's own values, the kind of bug an off-by-a-factor chunking produces.
`pkb check 1 examples/wrong_allreduce_half.py` must fail on every rank with the first mismatch at
row rows/2.
"""

import torch.distributed as dist


def solution(x):
    out = x.clone()
    half = out.shape[0] // 2
    top = out[:half].contiguous()
    dist.all_reduce(top)
    out[:half] = top
    return out
