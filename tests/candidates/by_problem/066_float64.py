"""Problem 66 summed in float64 and rounded once to float32, exchanged with a list of point-to-point
sends instead of an all-to-all: independent of the reference, and must pass."""

import torch
import torch.distributed as dist


def solution(grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    sums = torch.zeros(seed_size, grad_output.shape[1], dtype=torch.float64)
    sums.index_add_(0, seed_inverse_ids, grad_output.double())
    send = list(sums.to(grad_output.dtype).split(counts_sent))
    recv = [grad_output.new_empty(n, grad_output.shape[1]) for n in counts_received]
    ops = []
    for peer in range(world):
        if peer == rank:
            recv[peer].copy_(send[peer])
            continue
        ops.append(dist.P2POp(dist.isend, send[peer].contiguous(), peer, group))
        ops.append(dist.P2POp(dist.irecv, recv[peer], peer, group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return torch.cat(recv)
