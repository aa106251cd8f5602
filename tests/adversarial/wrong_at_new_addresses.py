"""Right while its inputs stay at the addresses it first saw; skips the reduction at any other.

Stands for every solution whose shortcut depends on where memory lies (buffers registered once,
pointer-keyed plans that a later placement no longer fits). With one placement per side it is simply
right. With several, the harness moves the inputs to new addresses between placements and still
compares every timed output with the judged one. Expected: bench with placements fails with "a timed
call's output ... differs".
"""

import torch.distributed as dist

_seen = set()
_calls = [0]


def solution(x):
    _calls[0] += 1
    if _calls[0] > 20 and x.data_ptr() not in _seen:
        return x.clone()  # this rank's own values: the reduction skipped
    _seen.add(x.data_ptr())
    out = x.clone()
    dist.all_reduce(out)
    return out
