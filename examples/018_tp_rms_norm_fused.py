"""Problem 18 (tp_rms_norm): tensor-parallel RMSNorm in two Triton kernels and a one-shot all-reduce.

What it does, per call:
1. a Triton kernel reads h_local once and writes each token's float32 sum of squares straight into
   a symmetric-memory buffer [tokens] (allocated and rendezvoused once per token count, cached);
2. `torch.ops.symm_mem.one_shot_all_reduce` sums those buffers over the ranks (every rank reads the
   tiny buffer of every peer over NVLink: one step, no NCCL launch path) into a fresh [tokens];
3. a second Triton kernel reads h_local and the weight again and writes
   h * rsqrt(sum / H + EPS) * weight, rounded to bf16 once, as the reference does (float32 math,
   division by H, then the weight, then the cast).

Reusing the cached buffer cannot race: the one-shot kernel ends with a barrier across all ranks
after its last remote read, so once it has finished here no peer still reads this rank's buffer,
and the next call's kernel 1, ordered after it on the same stream, may overwrite it.

Predicted effect: the reference makes a float32 copy of h and runs about ten kernels over it
(square, sum, two in-place multiplies, the cast), about 4.6 GB of HBM traffic per rank on `large`
(32768 x 4096), ~1.1 ms of it at 4.3 TB/s; this version reads h twice and writes the output once
(0.8 GB, ~0.2 ms) and replaces NCCL's all-reduce of 128 KiB with the one-shot kernel. Recorded
figures: docs/gpu-results.md.

Conditions: CUDA GPUs with NVLink peer access, torch symmetric memory (one_shot_all_reduce exists
with this signature in torch 2.11 and 2.13, any world size, no multicast) and Triton at call time;
the module imports without either. bf16 or fp16 activations, any hidden_local.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only machines: the module still imports, solution() raises
    triton = None

EPS = 1e-6  # the problem's EPS
BLOCK_T, BLOCK_H = 8, 512  # tokens x columns per program: 16-byte loads, bounded registers

if triton is not None:

    @triton.jit
    def _sum_squares_kernel(
        h_ptr, out_ptr, tokens, hidden, stride, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr
    ):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < tokens
        acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        for start in range(0, hidden, BLOCK_H):
            cols = start + tl.arange(0, BLOCK_H)
            mask = row_ok[:, None] & (cols < hidden)[None, :]
            x = tl.load(h_ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)
            x = x.to(tl.float32)
            acc += x * x
        tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_ok)

    @triton.jit
    def _normalize_kernel(h_ptr, w_ptr, sum_sq_ptr, out_ptr, tokens, hidden, stride, full_hidden, eps,
                          BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        row_ok = rows < tokens
        col_ok = cols < hidden
        mask = row_ok[:, None] & col_ok[None, :]
        inv_rms = tl.math.rsqrt(tl.load(sum_sq_ptr + rows, mask=row_ok, other=1.0) / full_hidden + eps)
        x = tl.load(h_ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x.to(tl.float32) * inv_rms[:, None] * w[None, :]
        offsets = rows[:, None] * hidden + cols[None, :]
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


_sum_buffers: dict[tuple, torch.Tensor] = {}


def _symmetric_sums(tokens: int, device: torch.device) -> torch.Tensor:
    """The cached float32 [tokens] symmetric buffer; allocated and rendezvoused (collectively) once."""
    key = (tokens, device)
    buf = _sum_buffers.get(key)
    if buf is None:
        buf = symm_mem.empty(tokens, dtype=torch.float32, device=device)
        symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        _sum_buffers[key] = buf
    return buf


def solution(h_local, weight_local):
    if triton is None or not h_local.is_cuda:
        raise RuntimeError("this solution needs CUDA tensors, Triton and symmetric memory")
    h = h_local if h_local.stride(-1) == 1 else h_local.contiguous()
    tokens, hidden = h.shape
    weight = weight_local.contiguous()
    sums = _symmetric_sums(tokens, h.device)
    _sum_squares_kernel[(triton.cdiv(tokens, BLOCK_T),)](
        h, sums, tokens, hidden, h.stride(0), BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H
    )
    total = torch.ops.symm_mem.one_shot_all_reduce(sums, "sum", dist.group.WORLD.group_name)
    out = torch.empty((tokens, hidden), dtype=h.dtype, device=h.device)
    grid = (triton.cdiv(tokens, BLOCK_T), triton.cdiv(hidden, BLOCK_H))
    full_hidden = hidden * dist.get_world_size()
    _normalize_kernel[grid](h, weight, total, out, tokens, hidden, h.stride(0), full_hidden, EPS,
                            BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H)  # fmt: skip
    return out
