"""The original benchmark's problem 45, exactly: a mean reduce-scatter of a flat buffer, then RMSNorm.

As the original's input builder makes them (random normal bf16): gamma [128], drawn once for all
ranks (the same on every rank), and on rank r, from a seed of its own, rs_input_1d [R * 128 * W],
with R = 1024 / max(W, 4) rows (256 at W = 2 and 4, 128 at W = 8). It is called as
solution(rs_input_1d, gamma, 1e-5). Each rank reduce-scatters the buffers in bf16 (sum), divides
its chunk by W, views it as [R, 128] and returns RMSNorm of its rows in float32 times gamma, rounded
to bf16: [R, 128]. Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the
inputs are drawn from secret seeds (pkb's, docs/variants.md).

RMSNorm cancels the division by W up to eps; the `pkb` variant sums without it.
"""

import math

import torch
import torch.distributed as dist

ID = 45
NAME = "reducescatter_fused_rmsnorm"
CATEGORY = "TP/SP"
SOURCE = "sequence-parallel transformer: row-parallel output reduce-scatter + RMSNorm"
SUMMARY = "Mean reduce-scatter of a flat bf16 [R * 128 * W], then RMSNorm of this rank's [R, 128]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"m": 1024, "hidden": 128}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
EPS = 1e-5


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _rows(ctx):
    w = ctx.world_size
    return max(2, max(ctx.size["m"], w) // max(w, 4))


def make_inputs(ctx):
    """The original's: gamma shared by all ranks, this rank's flat buffer, eps 1e-5."""
    hidden = ctx.size["hidden"]
    gamma = ctx.randn(hidden, shared=True)
    return ctx.randn(_rows(ctx) * hidden * ctx.world_size), gamma, EPS


@torch.no_grad()
def solution(rs_input_1d, gamma, eps):
    w = dist.get_world_size()
    chunk = rs_input_1d.new_empty(rs_input_1d.numel() // w)
    dist.reduce_scatter_tensor(chunk, rs_input_1d.contiguous(), op=dist.ReduceOp.SUM)
    x = chunk.div_(w).view(-1, gamma.numel()).float()
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True).add_(eps)) * gamma.float()
    return y.to(rs_input_1d.dtype)


def traffic(ctx):
    """Per GPU: each of its W - 1 foreign chunks to that chunk's owner. Memory: read the buffer and
    gamma, write [R, 128]."""
    w, hidden, isz = ctx.world_size, ctx.size["hidden"], ctx.dtype.itemsize
    chunk = _rows(ctx) * hidden
    return {
        "nvlink_bytes": (w - 1) * chunk * isz,
        "hbm_bytes": (w * chunk + hidden + chunk) * isz,
        "flops": (w - 1) * chunk + 4 * chunk,
        "rounds": 1,
    }
