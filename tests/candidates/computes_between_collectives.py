"""Problem 1's all-reduce with compute between collectives: a matmul loop after a first all-reduce, while
a second (asynchronous) all-reduce runs. Right outputs, wasted work: the profile must show the compute,
and on CPU (gloo runs collectives on its own threads) the compute overlapping the second collective."""

import torch
import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    spare = x[:64].float()
    pending = dist.all_reduce(spare.clone(), async_op=True)
    block = x[:128].float()
    for _ in range(3):
        block = torch.tanh(block @ block.T) @ block
    pending.wait()
    return out
