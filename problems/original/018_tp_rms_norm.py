"""The original benchmark's problem 18, exactly: RMSNorm over a hidden dimension split across ranks.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds its
slice of the hidden states [1024, 1024] and its own weight [1024] and is called as
solution(hidden, weight, 1e-5). Each rank returns weight * bf16(x / sqrt(mean of x^2 over all W
slices + eps)), the squares summed in float32 and all-reduced, the mean over W * 1024 columns.
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 18
NAME = "tp_rms_norm"
CATEGORY = "TP"
SOURCE = "tensor-parallel RMSNorm (hidden dimension sharded)"
SUMMARY = "RMSNorm of bf16 [1024, 1024] slices of a hidden dimension split across ranks (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "hidden_local": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's hidden slice and its own weight, standard normal; eps 1e-5."""
    s = ctx.size
    return ctx.randn(s["rows"], s["hidden_local"]), ctx.randn(s["hidden_local"]), 1e-5


def solution(local_hidden_states, local_weight, variance_epsilon):
    x = local_hidden_states.to(torch.float32)
    squares = x.pow(2).sum(dim=-1, keepdim=True)
    dist.all_reduce(squares, op=dist.ReduceOp.SUM)
    variance = squares / (x.shape[-1] * dist.get_world_size())
    return local_weight * (x * torch.rsqrt(variance + variance_epsilon)).to(local_hidden_states.dtype)


def traffic(ctx):
    """Per GPU: one float32 sum of squares per row, all-reduced (2 (W-1)/W of them each way)."""
    s, w = ctx.size, ctx.world_size
    elems = s["rows"] * s["hidden_local"]
    return {
        "nvlink_bytes": 2 * (w - 1) / w * s["rows"] * 4,
        "hbm_bytes": (2 * elems + s["hidden_local"]) * ctx.dtype.itemsize,
        "flops": 4 * elems,
        "rounds": 2,
    }
