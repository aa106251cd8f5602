"""Problem 1 written the original benchmark's way: `from utils.cuda_helpers import compile_cuda_extension`
and one CUDA source carrying its own bindings, built on the first call. On CPU ranks (no CUDA) it falls
back to torch, so the import and the discovery of its build are what a CPU test sees."""

import torch.distributed as dist
from utils.cuda_helpers import compile_cuda_extension

CUDA_SRC = r"""
#include <torch/extension.h>
#include <cuda_bf16.h>

__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

torch::Tensor copy_of(torch::Tensor x) { return x.clone(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("copy_of", &copy_of, "a copy"); }
"""

_ext = None


def _get_ext():
    global _ext
    if _ext is None:
        _ext = compile_cuda_extension("original_style_ext", CUDA_SRC)
    return _ext


def solution(tensor):
    out = _get_ext().copy_of(tensor) if tensor.is_cuda else tensor.clone()
    dist.all_reduce(out)
    return out
