"""An honest solution that keeps state across calls (issue 17's control): a process group of its
own, created on the first call, and an output buffer per shape, reused (its contents copied out).

Nothing it keeps depends on the inputs' values, so fresh input sets cost what replayed ones do.
Expected: bench pass, not flagged as faster on inputs it has seen.
"""

import torch
import torch.distributed as dist

_state = {}


def solution(x):
    if "group" not in _state:  # collective: every rank creates it on its first call
        _state["group"] = dist.new_group(list(range(dist.get_world_size())))
    key = (tuple(x.shape), x.dtype, x.device)
    buf = _state.get(key)
    if buf is None:
        buf = _state[key] = torch.empty_like(x)
    buf.copy_(x)
    dist.all_reduce(buf, group=_state["group"])
    return buf.clone()
