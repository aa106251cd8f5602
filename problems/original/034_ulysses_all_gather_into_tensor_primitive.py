"""The original benchmark's problem 34, exactly: Ulysses' all-gather of a tensor along dimension 0.

As the original's input builder makes it (random normal bf16, a seed per rank): rank r holds x
[1024, 1024] and is called as solution(x, None). Every rank returns every rank's x stacked along
dimension 0 in rank order, [1024 W, 1024]. Judged as the original harness judges: atol = rtol =
1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).
"""

import math

import torch.distributed as dist

ID = 34
NAME = "ulysses_all_gather_into_tensor_primitive"
CATEGORY = "SP"
SOURCE = "VeOmni Ulysses sequence parallelism (all_gather_into_tensor)"
SUMMARY = "All-gather a bf16 [1024, 1024] along dimension 0 into [1024 W, 1024] (the original's call)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: x standard normal, group None."""
    return ctx.randn(ctx.size["rows"], ctx.size["cols"]), None


def solution(x, group=None):
    w = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] * w, *x.shape[1:]))
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def traffic(ctx):
    """Per GPU: every other rank's x arrives once."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {"nvlink_bytes": (w - 1) * nbytes, "hbm_bytes": (1 + w) * nbytes, "flops": 0, "rounds": 1}
