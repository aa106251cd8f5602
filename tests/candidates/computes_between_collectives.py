"""Problem 1's all-reduce with compute between collectives: a matmul loop after a first all-reduce, while
a second (asynchronous) all-reduce is pending. Right outputs, wasted work: the profile must show the
compute, and on CPU (gloo runs collectives on its own threads) the compute overlapping the second
collective.

Rank 0 starts the second all-reduce, lets a gloo thread take it up (the trace shows the collective from
then on), computes, and only then tells the other ranks to join it: its collective is pending for all
of its compute however the machine schedules the ranks. (Without the message a rank that ran ahead
had joined before rank 0 computed, and the collective was over before the compute began.)"""

import time

import torch
import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    spare = x[:64].float()
    done = torch.zeros(1)
    if dist.get_rank() == 0:
        pending = dist.all_reduce(spare.clone(), async_op=True)
        time.sleep(0.005)
    block = x[:128].float()
    for _ in range(3):
        block = torch.tanh(block @ block.T) @ block
    if dist.get_rank() == 0:
        for peer in range(1, dist.get_world_size()):
            dist.send(done, peer)
    else:
        dist.recv(done, 0)
        pending = dist.all_reduce(spare.clone(), async_op=True)
    pending.wait()
    return out
