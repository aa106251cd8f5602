"""Problem 1 with a C++ extension whose source is made at call time (from the input's dtype), so no
discovery can find it before the run: each job builds it itself, once for all of its ranks."""

import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

_extension = None


def solution(x):
    global _extension
    if _extension is None:
        tag = str(x.dtype).replace("torch.", "")
        source = f"""
#include <torch/extension.h>
// made for {tag}
torch::Tensor copy_of(torch::Tensor x) {{ return x.clone(torch::MemoryFormat::Contiguous); }}
"""
        _extension = load_inline(name=f"pkb_test_dynamic_{tag}", cpp_sources=source, functions=["copy_of"])
    out = _extension.copy_of(x)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
