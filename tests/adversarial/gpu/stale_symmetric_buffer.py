"""For problem 1 on GPUs: stages each input into a symmetric buffer once per input pointer and
reuses that staged copy on every later call with the same pointer, skipping the copy ("same buffer,
same data"). The timed calls then only run the one-shot all-reduce over stale buffers.

Right as long as a buffer's contents never change. The harness rotates the contents of its input
sets between timed calls (same buffers, other data). Expected: bench fails ("a timed call's output
... differs"), or check already fails when a trial's fresh input lands on a reused address.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

_staged: dict[tuple, torch.Tensor] = {}


def solution(x):
    group = dist.group.WORLD.group_name
    key = (x.data_ptr(), tuple(x.shape), x.dtype)
    buf = _staged.get(key)
    if buf is None:
        buf = symm_mem.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buf, group)
        buf.copy_(x)
        _staged[key] = buf
    return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)
