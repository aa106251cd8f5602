"""Problem 66 exchanged with a list of point-to-point sends instead of an all-to-all and summed in
float64, rounded once to float32: independent of the reference, and must pass."""

import torch
import torch.distributed as dist


def solution(grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    send = grad_output.split(counts_sent)  # chunk i: for the rank i places on
    recv = [grad_output.new_empty(n, grad_output.shape[1]) for n in counts_received]
    recv[0].copy_(send[0])
    ops = []
    for offset in range(1, world):
        peer = (rank + offset) % world
        ops.append(dist.P2POp(dist.isend, send[offset].contiguous(), peer, group))
        ops.append(dist.P2POp(dist.irecv, recv[offset], peer, group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    sums = torch.zeros(seed_size, grad_output.shape[1], dtype=torch.float64)
    sums.index_add_(0, seed_inverse_ids, torch.cat(recv).double())
    return sums.to(grad_output.dtype)
