"""Right on the first inputs it sees, zeros on every input after the first EIGHT (issue 17).

A check's few trials and a benchmark's replayed input sets (at most eight, each judged on its first
call) are all among the first eight, so before issue 17 it passed and was timed on its cached answers.
The timed calls on fresh input sets are judged too. Expected: bench fail, "wrong on a fresh input set".
"""

import torch
import torch.distributed as dist

EIGHT = 8
_cache = {}


def _fingerprint(x):
    flat = x.reshape(-1)
    probes = flat[:: max(1, flat.numel() // 8)][:8]
    return (tuple(x.shape), x.dtype, tuple(probes.tolist()))


def solution(x):
    key = _fingerprint(x)
    hit = _cache.get(key)
    if hit is not None:
        return hit.clone()
    if len(_cache) >= EIGHT:
        return torch.zeros_like(x)  # an answer for inputs it will never be asked about again
    out = x.clone()
    dist.all_reduce(out)
    _cache[key] = out
    return out.clone()
