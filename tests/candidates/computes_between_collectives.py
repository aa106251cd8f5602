"""Problem 1's all-reduce with compute between collectives: a matmul loop after a first all-reduce, while
a second (asynchronous) all-reduce is pending. Right outputs, wasted work: the profile must show the
compute, and on CPU (gloo runs collectives on its own threads) the compute overlapping the second
collective. Rank 0 starts the second all-reduce before its matmuls and the other ranks after theirs, so
rank 0's collective is pending for all of its compute however the machine schedules the ranks."""

import torch
import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    spare = x[:64].float()
    pending = dist.all_reduce(spare.clone(), async_op=True) if dist.get_rank() == 0 else None
    block = x[:128].float()
    for _ in range(3):
        block = torch.tanh(block @ block.T) @ block
    if pending is None:
        pending = dist.all_reduce(spare.clone(), async_op=True)
    pending.wait()
    return out
