# Problem 13 written the original benchmark's way, with a C++ extension that does not compile (a
# missing semicolon): `pkb eval` reports it as a build failure and goes on with the batch. C++ rather
# than CUDA so that it fails for the same reason on a machine without a GPU.
import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    return torch::matmul(a, b)
}
"""

_ext = load_inline("gemm_allreduce_matmul", cpp_sources=CPP_SRC, functions=["matmul"])


def solution(A_local: torch.Tensor, B_local: torch.Tensor) -> torch.Tensor:
    out = _ext.matmul(A_local, B_local)
    dist.all_reduce(out)
    return out
