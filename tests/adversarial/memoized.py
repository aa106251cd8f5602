"""Memoized output: the first call's result is returned on every later call.

Fresh inputs in every trial (check) and in every timed input set (bench) make the stale answer
wrong. Expected: fail, every rank `wrong`, from the second trial / input set on.
"""

import torch.distributed as dist

_memo = []


def solution(x):
    if not _memo:
        out = x.clone()
        dist.all_reduce(out)
        _memo.append(out)
    return _memo[0].clone()
