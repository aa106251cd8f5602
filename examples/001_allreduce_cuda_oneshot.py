"""Problem 1 (allreduce): a hand-written CUDA kernel that sums every peer's buffer over NVLink.

What it does, per call:
1. copy x into this rank's symmetric-memory buffer (allocated and rendezvoused once per shape);
2. a barrier across the ranks (torch's symmetric-memory barrier: after it, every peer's copy is done
   and visible);
3. one kernel, written here and built with `load_inline`, reads the same 16-byte slice of every rank's
   buffer through the peers' device pointers (plain loads that travel over NVLink), adds them in float32
   and writes bf16 to a fresh output: a one-shot all-reduce, one communication step;
4. a second barrier, so that no rank overwrites its buffer in the next call while a peer still reads it.

Predicted effect: at the `pkb` size (2 MiB) the all-reduce is latency-bound; one step of direct peer
loads plus two light barriers should beat NCCL's protocol. At `large` one-shot moves (W-1) times the
bytes a two-shot schedule moves, so expect no gain there. Figures: docs/gpu-results.md.

Conditions: CUDA GPUs with peer access, bf16 input whose element count is a multiple of 8 (16-byte
vectors); other inputs fall back to NCCL. The extension is built on the first call (the common pattern:
module-level source strings, `load_inline` on first use); pkb builds it once per node and caches it.
NVLink multicast is not used.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int MAX_RANKS = 8;

struct Peers {
    const uint4* buffers[MAX_RANKS];
};

// Each thread owns 16-byte vectors (8 bf16) at a grid stride and sums them over the ranks in float32.
__global__ void oneshot_sum_bf16(Peers peers, int world, uint4* __restrict__ out, long long vectors) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vectors; i += stride) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int r = 0; r < MAX_RANKS; ++r) {  // unrolled: the pointers stay in parameter space
            if (r >= world) break;
            uint4 v = peers.buffers[r][i];
            const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 f = __bfloat1622float2(h[k]);
                acc[2 * k] += f.x;
                acc[2 * k + 1] += f.y;
            }
        }
        uint4 o;
        __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (int k = 0; k < 4; ++k) oh[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
        out[i] = o;
    }
}

torch::Tensor oneshot_sum(std::vector<int64_t> pointers, torch::Tensor out) {
    TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kBFloat16 && out.is_contiguous());
    TORCH_CHECK(out.numel() % 8 == 0, "element count must be a multiple of 8");
    TORCH_CHECK(pointers.size() >= 1 && pointers.size() <= MAX_RANKS, "1 to 8 ranks");
    Peers peers;
    for (size_t r = 0; r < pointers.size(); ++r) {
        peers.buffers[r] = reinterpret_cast<const uint4*>(pointers[r]);
    }
    long long vectors = out.numel() / 8;
    int threads = 512;
    long long wanted = (vectors + threads - 1) / threads;
    int blocks = (int)std::min<long long>(wanted, 132LL * 4);
    auto stream = at::cuda::getCurrentCUDAStream();
    oneshot_sum_bf16<<<blocks, threads, 0, stream>>>(
        peers, (int)pointers.size(), reinterpret_cast<uint4*>(out.data_ptr()), vectors);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SOURCE = "torch::Tensor oneshot_sum(std::vector<int64_t> pointers, torch::Tensor out);"

_extension = None
_buffers: dict[tuple, tuple[torch.Tensor, object]] = {}


def _kernels():
    global _extension
    if _extension is None:
        _extension = load_inline(
            name="pkb_example_oneshot_allreduce",
            cpp_sources=CPP_SOURCE,
            cuda_sources=CUDA_SOURCE,
            functions=["oneshot_sum"],
            extra_cuda_cflags=["-O3"],
        )
    return _extension


def _symmetric(shape: torch.Size, dtype: torch.dtype, device: torch.device):
    """This shape's symmetric buffer and its handle; allocated and rendezvoused (collectively) once."""
    key = (tuple(shape), dtype, device)
    if key not in _buffers:
        buf = symm_mem.empty(tuple(shape), dtype=dtype, device=device)
        handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        _buffers[key] = (buf, handle)
    return _buffers[key]


def solution(x):
    if not x.is_cuda or x.dtype != torch.bfloat16 or x.numel() % 8 or dist.get_world_size() > 8:
        out = x.clone()
        dist.all_reduce(out)
        return out
    ext = _kernels()
    x = x.contiguous()
    buf, handle = _symmetric(x.shape, x.dtype, x.device)
    buf.copy_(x)
    handle.barrier(channel=0)  # every peer's copy is done before any rank reads it
    out = torch.empty_like(x)
    ext.oneshot_sum(list(handle.buffer_ptrs), out)
    handle.barrier(channel=0)  # no rank refills its buffer while a peer still reads it
    return out
