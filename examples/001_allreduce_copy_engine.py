"""Problem 1 (allreduce): a reduce-scatter and an all-gather whose peer transfers are copy-engine copies.

What it does, per call (W ranks, each owning rows/W rows of the result):
1. copy x into region 0 of this rank's symmetric-memory buffer (a local copy);
2. barrier across the ranks (torch's symmetric-memory barrier kernel): every peer's region 0 is ready;
3. for every rank p, `staged[p].copy_(peer p's region 0, my rows)`: a contiguous device-to-device copy,
   which torch issues as cudaMemcpyAsync, so the copy engine pulls the rows over NVLink (no SM kernel
   touches peer memory);
4. sum the W staged slices in float32 on this GPU (an SM kernel, local data only) and write the bf16 sum
   into region 1 of the buffer, my rows; barrier;
5. for every rank p, copy peer p's rows of region 1 into the output (copy engine again); barrier, so
   that no rank overwrites its buffer in the next call while a peer still reads it.

Traffic per rank and call: (W-1)/W of the matrix pulled in step 3 and again in step 5, i.e. the
2(W-1)/W of problem 1's traffic model each way. Written as the copy-engine case of issue 34's evidence
(docs/nvlink-counters.md): the profile should attribute its bytes to the copy engine, where example
001_allreduce_cuda_oneshot.py moves them with SM loads and the reference with NCCL's kernels. It is not
tuned: the copies run one after another on one stream. On 2 H200s (2026-11-27, docs/gpu-results.md)
it passed and ran at 0.53x the reference at `pkb` and 0.55x at `large`; NVML counted exactly the
model's bytes per call, and ncu could not count its kernels (its counter launch failed).

Conditions: CUDA GPUs with peer access (NVLink), torch symmetric memory (`symm_mem.empty`,
`rendezvous`, the handle's `get_buffer` and `barrier`; no multicast), rows divisible by the world size
(else NCCL's all_reduce).
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

_state: dict[tuple, tuple] = {}


def _buffers(x: torch.Tensor) -> tuple:
    """This rank's buffer (regions 0 and 1), its handle, and every rank's buffer as seen from here;
    allocated and rendezvoused (collectively) once per shape."""
    key = (tuple(x.shape), x.dtype, x.device)
    state = _state.get(key)
    if state is None:
        shape = (2, *x.shape)
        buf = symm_mem.empty(shape, dtype=x.dtype, device=x.device)
        handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        peers = [handle.get_buffer(p, shape, x.dtype) for p in range(dist.get_world_size())]
        state = (buf, handle, peers)
        _state[key] = state
    return state


def solution(x):
    if not x.is_cuda:
        raise RuntimeError("this solution needs CUDA tensors (symmetric memory)")
    world, rank = dist.get_world_size(), dist.get_rank()
    if x.shape[0] % world:
        out = x.clone()
        dist.all_reduce(out)
        return out
    x = x.contiguous()
    buf, handle, peers = _buffers(x)
    rows = x.shape[0] // world
    mine = slice(rank * rows, (rank + 1) * rows)
    buf[0].copy_(x)
    handle.barrier(channel=0)
    staged = torch.empty((world, rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    for p in range(world):
        staged[p].copy_(peers[p][0, mine])
    buf[1, mine].copy_(staged.float().sum(0).to(x.dtype))
    handle.barrier(channel=0)
    out = torch.empty_like(x)
    for p in range(world):
        theirs = slice(p * rows, (p + 1) * rows)
        out[theirs].copy_(peers[p][1, theirs])
    handle.barrier(channel=0)
    return out
