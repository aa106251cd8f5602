"""The original benchmark's problem 35, exactly: Ulysses' all-gather of tensors whose sizes may differ.

As the original's input builder makes it (random normal bf16, a seed per rank): rank r holds x
[1024, 1024] and is called as solution(x, 0, None). Each rank learns every rank's shape (an
all-gather of the sizes), gathers every rank's x and returns them concatenated along dimension 0
(the gather dimension) in rank order: [1024 W, 1024]. Judged as the original harness judges: atol =
rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: the exchange of the sizes. Every rank's x has the same shape in the
original's inputs, so a plain all-gather gives the same output.
"""

import math

import torch
import torch.distributed as dist

ID = 35
NAME = "ulysses_all_gather_variable_primitive"
CATEGORY = "SP"
SOURCE = "VeOmni Ulysses sequence parallelism (all_gather_variable)"
SUMMARY = "All-gather bf16 [1024, 1024] along dimension 0, sizes exchanged first (the original's call)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: x standard normal, gather dimension 0, group None."""
    return ctx.randn(ctx.size["rows"], ctx.size["cols"]), 0, None


def solution(x, gather_dim, group=None):
    group = group or dist.group.WORLD
    w = dist.get_world_size(group)
    x = x.contiguous()
    shape = torch.tensor(x.shape, dtype=torch.int64, device=x.device)
    shapes = [torch.empty_like(shape) for _ in range(w)]
    dist.all_gather(shapes, shape, group=group)
    parts = [x.new_empty(torch.Size(s.tolist())) for s in shapes]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=gather_dim)


def traffic(ctx):
    """Per GPU: its x (and its shape, 16 bytes) to each of the W - 1 peers; x read once, the output
    written once."""
    w = ctx.world_size
    nbytes = ctx.size["rows"] * ctx.size["cols"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * (nbytes + 16),
        "hbm_bytes": (1 + w) * nbytes,
        "flops": 0,
        "rounds": 1,
    }
