"""The original benchmark's problem 15, exactly: all-gather, SiLU(x W1) W2, then a reduce-scatter.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds
x_local [M, H / W], its block of x's columns, with M = 1024 and H = 256 (each rounded up to a multiple
of W), and its own W1 [H, 512] and W2 [512, H]; W1 and W2 differ from rank to rank. Rank r gathers
x [M, H] (the blocks side by side in rank order), computes a = SiLU(x @ W1_r), takes rows
r M/W .. (r+1) M/W - 1 of a, multiplies them by W2_r, places that block in rank r's rows of an
otherwise zero [M, H] buffer, and reduce-scatters the buffers: it returns [M / W, H]. Called as
solution(x_local, W1, W2). Judged as the original harness judges: atol = rtol = 1e-2, no norm bound;
the inputs are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: every other rank's buffer is zero in rank r's rows, so the reduce-scatter
returns rank r's own block: SiLU(x[rows of r] @ W1_r) @ W2_r needs only the all-gather of x's rows of
r, and no reduction. The `pkb` variant (Megatron's MLP with shared weights) was redesigned for this.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 15
NAME = "combined_sharded_gemms"
CATEGORY = "TP/SP"
SOURCE = "Megatron-LM sequence-parallel MLP"
SUMMARY = "All-gather x's bf16 column blocks, SiLU(x W1_r) W2_r on this rank's rows, then reduce-scatter."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (M and H rounded up to multiples of it)"
SIZES = {"pkb": {"m": 1024, "hidden": 256, "ffn": 512}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _dims(ctx):
    w = ctx.world_size
    m, h = (-(-ctx.size[k] // w) * w for k in ("m", "hidden"))  # rounded up to multiples of W
    return m, h, ctx.size["ffn"]


def make_inputs(ctx):
    """The original's: this rank's column block of x, its own W1 and W2, standard normal."""
    m, h, f = _dims(ctx)
    return ctx.randn(m, h // ctx.world_size), ctx.randn(h, f), ctx.randn(f, h)


def solution(x_local, W1, W2):
    rank, w = dist.get_rank(), dist.get_world_size()
    m = x_local.shape[0]
    m_local = m // w
    shards = [torch.empty_like(x_local) for _ in range(w)]
    dist.all_gather(shards, x_local.contiguous())
    a = F.silu(torch.matmul(torch.cat(shards, dim=1), W1))
    block = torch.matmul(a[rank * m_local : (rank + 1) * m_local], W2)
    buf = block.new_zeros((m, block.shape[1]))
    buf[rank * m_local : (rank + 1) * m_local] = block
    out = block.new_empty((m_local, block.shape[1]))
    dist.reduce_scatter_tensor(out, buf, op=dist.ReduceOp.SUM)
    return out


def traffic(ctx):
    """Per GPU, the least: the other ranks' columns of this rank's rows of x (see the docstring: the
    reduction adds nothing). FLOPs: this rank's rows through both GEMMs."""
    m, h, f = _dims(ctx)
    w, isz = ctx.world_size, ctx.dtype.itemsize
    rows = m // w
    return {
        "nvlink_bytes": (w - 1) * rows * (h // w) * isz,
        "hbm_bytes": (rows * h + 2 * h * f + rows * h) * isz,
        "flops": 4 * rows * h * f,
        "rounds": 1,
    }
