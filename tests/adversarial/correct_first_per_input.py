"""Right on the first call with each input buffer (the call a harness judges), cheap guesses after.

Only the check of every timed output catches it. Expected: bench fails with "a timed call's
output ... differs" (check may pass: its trials use fresh buffers).
"""

import torch.distributed as dist

_seen = set()


def solution(x):
    if x.data_ptr() not in _seen:
        _seen.add(x.data_ptr())
        out = x.clone()
        dist.all_reduce(out)
        return out
    return x * dist.get_world_size()
