"""Outputs memoized by a fingerprint of a few input values (issue 17): a hit returns the cached sum.

Always right (a miss computes), so every judged output passes, and the buffer rotation does not
catch it (the cache follows the values, not the addresses). The timed calls replay a few input sets,
so before issue 17 every timed call hit: `pkb bench 1` credited 13.1x on CPU. Timed calls on fresh
input sets miss. Expected: bench `suspect`, faster_on_seen_inputs, "not credited".
"""

import torch.distributed as dist

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
    out = x.clone()
    dist.all_reduce(out)
    _cache[key] = out
    return out.clone()
