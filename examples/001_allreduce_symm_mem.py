"""Problem 1 (allreduce): sum a bf16 [rows, cols] matrix over all ranks through symmetric memory.

What it does: the input is copied into a symmetric-memory buffer that every peer can read over
NVLink, then one of PyTorch's symmetric-memory all-reduce kernels sums it straight into a freshly
allocated output:

- up to ONE_SHOT_MAX_BYTES (or at world sizes other than 2, 4, 8), `one_shot_all_reduce_copy`: one
  kernel copies x into the buffer, syncs with the peers and sums every peer's whole buffer locally.
  One step and one launch: the latency floor for small messages.
- above it, `two_shot_all_reduce_out`: a reduce-scatter (each rank sums its 1/W slice from every
  peer) then an all-gather of the summed slices, the bandwidth-optimal 2(W-1)/W traffic.

The buffer is allocated and rendezvoused once per (shape, dtype, device) and cached; the collective
allocation happens on the first call only. Reusing it cannot race: both kernels end with a barrier
across all ranks (`sync_remote_blocks` after the last remote read), so when this rank's kernel of
call k has finished, no peer still reads this rank's buffer, and whatever writes the buffer in call
k+1 (the copy, or the one-shot kernel's own copy) is ordered after it on the same stream.

Predicted effect: the symmetric-memory kernels read peers' memory directly instead of NCCL's
protocol steps, which should pay at the 2 MiB `pkb` size, where latency dominates. On `large`
(256 MiB) the op is bandwidth-bound, the two-shot kernel (at most 24 blocks) is no faster than NCCL
and the extra copy into the buffer (~0.12 ms) is not hidden: expect parity or a small loss. Recorded
figures: docs/gpu-results.md.

Conditions: CUDA GPUs with peer access (NVLink), torch symmetric memory (the ops exist with these
signatures in torch 2.11 and 2.13; no multicast), bf16 or fp32 with an even element count (4-byte
aligned sizes), x's storage aligned like a fresh allocation. Any world size: two-shot at 2, 4, 8.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

# One-shot reads every peer's whole buffer (W-1 times the bytes): below ~1 MiB its single step wins.
ONE_SHOT_MAX_BYTES = 1 << 20
TWO_SHOT_WORLD_SIZES = (2, 4, 8)  # the two-shot kernel is compiled for these only

_buffers: dict[tuple, torch.Tensor] = {}


def _symmetric_buffer(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The cached symmetric buffer for this shape; allocated and rendezvoused (collectively) once."""
    key = (tuple(shape), dtype, device)
    buf = _buffers.get(key)
    if buf is None:
        buf = symm_mem.empty(tuple(shape), dtype=dtype, device=device)
        symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        _buffers[key] = buf
    return buf


def solution(x):
    if not x.is_cuda:
        raise RuntimeError("this solution needs CUDA tensors (symmetric memory)")
    group_name = dist.group.WORLD.group_name
    x = x.contiguous()
    buf = _symmetric_buffer(x.shape, x.dtype, x.device)
    small = x.numel() * x.element_size() <= ONE_SHOT_MAX_BYTES
    if small or dist.get_world_size() not in TWO_SHOT_WORLD_SIZES:
        # One launch: the kernel copies x into the buffer, syncs, reads every peer's buffer.
        return torch.ops.symm_mem.one_shot_all_reduce_copy(buf, x, "sum", group_name)
    buf.copy_(x)
    out = torch.empty_like(x)
    torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", group_name, out)
    return out
