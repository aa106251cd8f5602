"""Problem 12 (allgather_gemm): all-gather of A along M overlapped with the GEMM by B_local.

What it does: each rank copies its shard A_local [M/W, K] into a symmetric-memory buffer (allocated
and rendezvoused once per shape, cached), and a barrier on the symmetric-memory handle says that
every shard is in place. The rank then multiplies its own shard at once, into its row block of a
fresh [M, N] output, while a side stream pulls the peers' shards over NVLink with the copy engines
(peer-to-peer memcpy, no SMs taken from the GEMM), one after another; the GEMM of each peer's
block waits only for that shard's copy event. A last barrier, after every pull of this call, keeps
a rank from overwriting its buffer in the next call while a peer may still read it. The result is
exactly all_gather(A) @ B_local: each row block is an ordinary bf16 matmul (float32 accumulation).

Predicted effect: the reference runs the NCCL all-gather (~0.35 ms on `large`, 4 H200s) and then
the GEMM (2 x 8192 x 4096 x 8192 = 550 GFLOP, ~0.68 ms) back to back. Here every pull (~0.09 ms
for a 32 MiB shard) hides behind a 0.17 ms block GEMM, so the time tends to the GEMM alone plus a
copy and two barriers. On `pkb` (a 1 GFLOP GEMM) the call is bound by the host's launches (about
3W + 5 of them) and loses to the reference. This example is for large GEMMs. Recorded figures:
docs/gpu-results.md.

Why not `torch.ops.symm_mem.fused_all_gather_matmul`: in a development probe (torch 2.11, not
recorded) it ran its block GEMMs on two streams at once, each slowed down, and lost at both sizes.

Conditions: CUDA GPUs with NVLink peer access and torch symmetric memory (`symm_mem.empty`,
`rendezvous`, the handle's `get_buffer` and `barrier`: present in torch 2.11 and 2.13); any world
size >= 2 dividing m. No multicast.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

_state: dict[tuple, tuple] = {}


def _peer_views(local: torch.Tensor, handle) -> list[torch.Tensor]:
    """Every rank's copy of `local`, readable and writable from here over NVLink.

    `get_buffer` counts from the start of the handle's allocation, which in newer torch (symmetric
    memory pools) may precede `local`; the offset is the same on every rank.
    """
    offset = (local.data_ptr() - handle.buffer_ptrs[handle.rank]) // local.element_size()
    shape = tuple(local.shape)
    return [handle.get_buffer(r, shape, local.dtype, offset) for r in range(handle.world_size)]


def _shard_exchange(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> tuple:
    """(local buffer, handle, peers' buffers by rank, copy stream) for this shard shape; made once."""
    key = (tuple(shape), dtype, device)
    if key not in _state:
        buf = symm_mem.empty(tuple(shape), dtype=dtype, device=device)
        handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        peers = _peer_views(buf, handle)
        events = [torch.cuda.Event() for _ in range(handle.world_size)]
        _state[key] = (buf, handle, peers, torch.cuda.Stream(device), events[0], events[1:])
    return _state[key]


def solution(a_local, b_local):
    if not a_local.is_cuda:
        raise RuntimeError("this solution needs CUDA tensors (symmetric memory)")
    state = _shard_exchange(a_local.shape, a_local.dtype, a_local.device)
    buf, handle, peers, copy_stream, shards_ready, arrived = state
    world, rank = handle.world_size, handle.rank
    m = a_local.shape[0]
    out = a_local.new_empty(world * m, b_local.shape[1])
    gathered = a_local.new_empty(world - 1, *a_local.shape)
    compute = torch.cuda.current_stream()

    buf.copy_(a_local)
    handle.barrier(channel=0)  # every rank's shard is in its buffer
    shards_ready.record(compute)
    # Queue the GEMM of the local shard first: the GPU works on it while the host queues the pulls.
    torch.mm(a_local, b_local, out=out[rank * m : (rank + 1) * m])
    copy_stream.wait_event(shards_ready)
    with torch.cuda.stream(copy_stream):
        for step in range(1, world):
            gathered[step - 1].copy_(peers[(rank + step) % world])
            arrived[step - 1].record(copy_stream)
    for step in range(1, world):
        peer = (rank + step) % world
        compute.wait_event(arrived[step - 1])
        torch.mm(gathered[step - 1], b_local, out=out[peer * m : (peer + 1) * m])
    # The compute stream has waited for every pull: after this barrier no rank reads any buffer.
    handle.barrier(channel=0)
    return out
