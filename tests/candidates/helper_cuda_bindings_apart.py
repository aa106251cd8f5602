"""Problem 1 with the same kernel and function as original_helper_cuda.py, built with `load_inline`
the way that rebuilds fastest after a kernel edit: the bindings come from `functions=` (generated
into the C++ unit, which an edit of the kernel leaves unchanged, so its object is reused from the
cache) and the CUDA source includes nothing beyond what `load_inline` already gives it. Built on the
first call; on CPU ranks (no CUDA) it falls back to torch, so the import and the discovery of its
build are what a CPU test sees."""

import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

CPP_SRC = "torch::Tensor copy_of(torch::Tensor x);"

CUDA_SRC = r"""
#include <cuda_bf16.h>

__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

torch::Tensor copy_of(torch::Tensor x) { return x.clone(); }
"""

_ext = None


def _get_ext():
    global _ext
    if _ext is None:
        _ext = load_inline(
            "bindings_apart_ext",
            cpp_sources=CPP_SRC,
            cuda_sources=CUDA_SRC,
            functions=["copy_of"],
            extra_cuda_cflags=["-O3"],
        )
    return _ext


def solution(tensor):
    out = _get_ext().copy_of(tensor) if tensor.is_cuda else tensor.clone()
    dist.all_reduce(out)
    return out
