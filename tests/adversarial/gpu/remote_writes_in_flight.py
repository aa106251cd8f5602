"""For problem 2 (all-gather) on GPUs: every rank pushes its shard into every peer's symmetric
buffer and returns that buffer without the closing barrier, so peers' writes into it may still be
in flight when solution() returns. Rank r delays its pushes by about r ms, so rank 0's output is
missing its peers' shards at return; they land a little later.

Reading the output after a device synchronization and a barrier (as the harness once did) sees the
complete result. The harness now copies the outputs on the caller's stream at return. Expected:
fail, rank 0 `wrong` (the last rank, whose pushes come last, may pass).
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

_state: dict[tuple, tuple] = {}


def _exchange(shape, dtype, device):
    key = (tuple(shape), dtype, device)
    if key not in _state:
        world = dist.get_world_size()
        buf = symm_mem.empty((world, *shape), dtype=dtype, device=device)
        handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        offset = (buf.data_ptr() - handle.buffer_ptrs[handle.rank]) // buf.element_size()
        peers = [handle.get_buffer(r, (world, *shape), dtype, offset) for r in range(world)]
        _state[key] = (buf, handle, peers)
    return _state[key]


def solution(x):
    buf, handle, peers = _exchange(x.shape, x.dtype, x.device)
    rank = handle.rank
    handle.barrier(channel=0)  # every peer is done with the previous call's buffer
    torch.cuda._sleep(2_000_000 * rank)  # about `rank` ms
    for peer in peers:
        peer[rank].copy_(x)  # a remote write over NVLink into the peer's buffer
    return buf  # no closing barrier: the peers' writes into buf may not have landed
