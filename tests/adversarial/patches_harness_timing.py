"""Patches the harness's timed-output check to always agree, then answers wrongly when timed.

Right on the first call with each input buffer (the judged one), a cheap guess afterwards, with
harness.timing.outputs_match replaced so the timing loop never notices. Expected: fail, every rank
`error` ("replaced harness.timing.outputs_match").
"""

import sys

import torch.distributed as dist

_seen = set()


def _always(*args, **kwargs):
    return True


def solution(x):
    timing = sys.modules.get("harness.timing")
    if timing is not None:
        timing.outputs_match = _always
    if x.data_ptr() not in _seen:
        _seen.add(x.data_ptr())
        out = x.clone()
        dist.all_reduce(out)
        return out
    return x * dist.get_world_size()
