"""Problem 1 with the same kernel and function as original_helper_cuda.py, built with `load_inline`
so that its CUDA unit includes no torch header at all (`no_implicit_headers=True`): the kernel and a
plain launcher taking raw pointers in the CUDA source, the tensors, the function and its bindings in
the C++ source (compiled once; an edit of the kernel leaves its object in the cache). The CUDA unit's
compilers then parse only CUDA's own headers. Built on the first call; on CPU ranks (no CUDA) it falls
back to torch, so the import and the discovery of its build are what a CPU test sees."""

import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>

void launch_scale(const float* x, float* y, float a, int n, void* stream);

torch::Tensor copy_of(torch::Tensor x) { return x.clone(); }
"""

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>

__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

void launch_scale(const float* x, float* y, float a, int n, void* stream) {
    scale_kernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, a, n);
}
"""

_ext = None


def _get_ext():
    global _ext
    if _ext is None:
        _ext = load_inline(
            "torch_free_ext",
            cpp_sources=CPP_SRC,
            cuda_sources=CUDA_SRC,
            functions=["copy_of"],
            extra_cuda_cflags=["-O3"],
            no_implicit_headers=True,
        )
    return _ext


def solution(tensor):
    out = _get_ext().copy_of(tensor) if tensor.is_cuda else tensor.clone()
    dist.all_reduce(out)
    return out
