"""Problem 1 with a C++ extension built on the first call of solution(), the way agents write them:
the sources are module-level strings, and load_inline runs lazily inside a helper."""

import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = """
#include <torch/extension.h>

torch::Tensor copy_of(torch::Tensor x) {
    return x.clone(torch::MemoryFormat::Contiguous);
}
"""

_extension = None


def _build(sources):
    return load_inline(name="pkb_test_copy", cpp_sources=sources, functions=["copy_of"], verbose=False)


def solution(x):
    global _extension
    if _extension is None:
        _extension = _build(CPP_SOURCE)
    out = _extension.copy_of(x)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
