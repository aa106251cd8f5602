"""For problem 1 on GPUs: the all-reduce runs on a side stream that the caller's stream never waits
for, behind a 10 ms device sleep. Events on the caller's stream see an almost empty call; anything
that synchronizes the whole device before reading (as the harness once did) sees the right sum.

The harness copies the outputs on the caller's stream as solution() returns: the copy runs before
the side stream's work. Expected: fail, every rank `wrong`.
"""

import torch
import torch.distributed as dist

_streams: dict[torch.device, torch.cuda.Stream] = {}


def solution(x):
    side = _streams.setdefault(x.device, torch.cuda.Stream(x.device))
    out = torch.empty_like(x)
    side.wait_stream(torch.cuda.current_stream())  # x is ready on the side stream
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # ~10 ms at 2 GHz: the side stream lags far behind
        out.copy_(x)
        dist.all_reduce(out)
    return out  # no torch.cuda.current_stream().wait_stream(side)
