"""The original benchmark's problem 53, exactly: FP8 (e4m3) round trip of a parameter shard, then an
all-gather.

As the original's input builder makes them (a seed per rank): rank r holds flat_param_shard [4096],
bf16 standard normal, and amax_history [16], bf16 filled with 1e-8; it is called as
solution(flat_param_shard, amax_history). Each rank rolls its history one place to the front and
writes its own amax max|flat_param_shard| last (in bf16), takes scale = max(history) / 448 in
float32 (in effect its own amax / 448), rounds the shard / scale to float8_e4m3fn and back (times
scale, to bf16) and all-gathers the results: it returns (params bf16 [4096 W], rank r's at
r * 4096, the new history bf16 [16]). Judged as the original harness judges: atol = rtol = 1e-2, no
norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).

The new history is each rank's own, computed without communicating.
"""

import math

import torch
import torch.distributed as dist

ID = 53
NAME = "fp8_allgather_params"
CATEGORY = "FSDP"
SOURCE = "FSDP float8 parameter all-gather with delayed scaling (torchao / Transformer Engine)"
SUMMARY = "FP8 e4m3 round trip of a bf16 shard [4096] at its amax scale, then all-gather to [4096 W]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"shard": 4096, "history": 16}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: a standard normal shard, a history of 1e-8."""
    s = ctx.size
    return ctx.randn(s["shard"]), ctx.full((s["history"],), 1e-8, dtype=torch.bfloat16)


@torch.no_grad()
def solution(flat_param_shard, amax_history):
    history = torch.roll(amax_history, shifts=-1, dims=0)
    history[-1] = flat_param_shard.abs().max().float().to(history.dtype)
    scale = history.max().clamp(min=1e-12).float() / FP8_MAX
    codes = flat_param_shard.float().div(scale).to(torch.float8_e4m3fn)
    recon = codes.float().mul_(scale).to(flat_param_shard.dtype)
    params = recon.new_empty(dist.get_world_size() * recon.numel())
    _all_gather(params, recon)
    return params, history


def traffic(ctx):
    """Per GPU: its fp8 codes (one byte an element) and its scale to each of the W - 1 peers, which
    dequantize them. Memory: read the shard, write the gathered params."""
    w, s, isz = ctx.world_size, ctx.size["shard"], ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * (s + 4),
        "hbm_bytes": (s + w * s + 2 * ctx.size["history"]) * isz,
        "flops": 3 * s + w * s,
        "rounds": 1,
    }
