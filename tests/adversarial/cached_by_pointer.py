"""Output cached by the input's data pointer: a repeat call on the same buffer skips the work.

Right whenever a buffer's contents never change, which is how a naive benchmark reuses its inputs.
The harness rotates the contents of its input sets between timed calls (same buffers, other data),
so a timed call returns the answer for data the buffer no longer holds. Expected: bench fails with
"a timed call's output ... differs".
"""

import torch.distributed as dist

_cache = {}


def solution(x):
    key = (x.data_ptr(), tuple(x.shape), x.dtype)
    hit = _cache.get(key)
    if hit is not None:
        return hit.clone()
    out = x.clone()
    dist.all_reduce(out)
    _cache[key] = out
    return out.clone()
