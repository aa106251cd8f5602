"""Replaces torch.cuda.Event (a fake whose elapsed_time is 1 µs) and torch.cuda.synchronize (a no-op)
at import: on a GPU every event-timed call would read 0.001 ms. Harmless to the CPU clock, and caught
on every device. Expected: fail, every rank `error` ("replaced torch.cuda.Event").
"""

import torch
import torch.distributed as dist


class _FakeEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        return None

    def synchronize(self):
        return None

    def elapsed_time(self, other):
        return 0.001


torch.cuda.Event = _FakeEvent
torch.cuda.synchronize = lambda *args, **kwargs: None


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return out
