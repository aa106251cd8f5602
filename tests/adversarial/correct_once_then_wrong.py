"""Right on the first call, then a cheap guess on every later call.

Check judges every trial, bench judges the first call of every input set and re-checks every timed
output. Expected: fail, every rank `wrong` from the second call on.
"""

import torch.distributed as dist

_calls = [0]


def solution(x):
    _calls[0] += 1
    if _calls[0] == 1:
        out = x.clone()
        dist.all_reduce(out)
        return out
    return x * dist.get_world_size()
