"""Work finished on a side thread after return: the output is returned empty and filled later.

The all-reduce runs on a second process group, from a thread that starts it a little after
solution() has returned, so the timed region (and any check made at return) sees a zero output that
becomes right later. The harness judges the output as it is at return. Expected: fail, `wrong`.
"""

import threading
import time

import torch
import torch.distributed as dist

_side = []


def _finish(x, out):
    time.sleep(0.05)
    tmp = x.clone()
    dist.all_reduce(tmp, group=_side[0])
    out.copy_(tmp)


def solution(x):
    if not _side:
        _side.append(dist.new_group(list(range(dist.get_world_size()))))
    out = torch.zeros_like(x)
    threading.Thread(target=_finish, args=(x, out), daemon=True).start()
    return out
