"""The original benchmark's problem 17, exactly: rotary embedding of a sequence shard, then all-gathers.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds
q_local and k_local [16, 16 / W, 8, 64] (batch, its positions, heads, head dim) and cos_local,
sin_local [16, 16 / W, 64] of its own. Every rank applies the rotation (x cos + rotate_half(x) sin,
rotate_half(x) = [-x2, x1] of x's halves) and returns the rotated q and k of every rank side by side
along the positions in rank order, ([16, 16, 8, 64], [16, 16, 8, 64]). Called as
solution(q_local, k_local, cos_local, sin_local). Judged as the original harness judges: atol = rtol
= 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 17
NAME = "rope_allgather"
CATEGORY = "CP/SP"
SOURCE = "rotary embedding with a sequence-sharded context (Hugging Face apply_rotary_pos_emb layout)"
SUMMARY = "Rotate bf16 q, k [16, 16/W, 8, 64] by their own cos, sin, then all-gather both along positions."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing the heads (8) and the positions (16)"
SIZES = {"pkb": {"batch": 16, "positions": 16, "heads": 8, "head_dim": 64}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    for key in ("heads", "positions"):
        if size[key] % world_size:
            return f"{key} = {size[key]} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: this rank's q, k, cos and sin, standard normal."""
    s = ctx.size
    b, t, h, d = s["batch"], s["positions"] // ctx.world_size, s["heads"], s["head_dim"]
    return ctx.randn(b, t, h, d), ctx.randn(b, t, h, d), ctx.randn(b, t, d), ctx.randn(b, t, d)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def solution(q_local, k_local, cos_local, sin_local):
    cos, sin = cos_local.unsqueeze(2), sin_local.unsqueeze(2)
    out = []
    for x in (q_local, k_local):
        rotated = (x * cos + _rotate_half(x) * sin).contiguous()
        parts = [torch.empty_like(rotated) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, rotated)
        out.append(torch.cat(parts, dim=1))
    return tuple(out)


def traffic(ctx):
    """Per GPU: every other rank's rotated q and k arrive once."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    local = s["batch"] * (s["positions"] // w) * s["heads"] * s["head_dim"]
    return {
        "nvlink_bytes": (w - 1) * 2 * local * isz,
        "hbm_bytes": (2 * local + 2 * local // s["heads"] + 2 * w * local) * isz,
        "flops": 6 * local,
        "rounds": 1,
    }
