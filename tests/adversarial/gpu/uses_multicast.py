"""For problem 1 on GPUs: an in-place multimem (NVLink multicast) all-reduce on a symmetric buffer.

Multicast is off on our hosts (it can take a shared node's GPUs out of service), so the static
report refuses this before anything runs, on any device. Expected: fail, every rank `error`,
"refused: multicast is unavailable".
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem


def solution(x):
    group = dist.group.WORLD.group_name
    buf = symm_mem.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buf, group)
    buf.copy_(x)
    torch.ops.symm_mem.multimem_all_reduce_(buf, "sum", group)
    return buf.clone()
