"""Rotary position embedding on a sequence shard of q and k, then an all-gather along the sequence.

Sequence (context) parallelism: the sequence of S positions is split across ranks, and rank r holds
positions r*S/W .. (r+1)*S/W of the queries and keys, q_local and k_local [batch, S/W, heads,
head_dim] (the Hugging Face layout), with the rotary tables for those positions, cos_local and
sin_local [batch, S/W, head_dim]. Every rank must apply the rotary embedding,
x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]) and the tables
broadcast over the heads, and return the embedded q and k of the whole sequence, a tuple of two
contiguous [batch, S, heads, head_dim] tensors in bf16 where positions r*S/W .. (r+1)*S/W come from
rank r. The reference computes the embedding in bf16 as Hugging Face's apply_rotary_pos_emb does.

The tables hold cos and sin of one angle per (batch, position, frequency), and as in Hugging Face
models the second half of their last dimension repeats the first; a solution may rely on that. The
angles are random rather than position x inverse frequency, so the tables must be read, not
recomputed.

Source: RoPE followed by a gather along the sequence (ParallelKernelBench problem 17). The sizes are
the original's (batch 16, 16 positions, 8 heads of 64; 2 positions per rank at 8 ranks). The
original asserts that the world size divides 8; here the rule is stated: it must divide the
sequence length.
"""

import math

import torch
import torch.distributed as dist

ID = 17
NAME = "rope_allgather"
CATEGORY = "CP/SP"
SOURCE = "rotary embedding with a sequence-sharded context (Hugging Face apply_rotary_pos_emb layout)"
SUMMARY = "RoPE on q, k [B, S/W, H, D] sequence shards, then all-gather both along S: 2x [B, S, H, D]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing seq"
SIZES = {
    # batch; seq: all positions (split across ranks); heads; head_dim: even
    "pkb": {"batch": 16, "seq": 16, "heads": 8, "head_dim": 64},
    "large": {"batch": 2, "seq": 16384, "heads": 32, "head_dim": 128},
}
# Outputs are O(1). The reference rounds each product and the sum to bf16; a solution computing in
# float32 and rounding once differs by up to two units in the last place (measured: at most 0.4 of
# this bound, relative norm 0.003). Gathering moves bits exactly.
TOLERANCE = {"atol": 0.02, "rtol": 0.02, "rel_norm": 0.01}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["seq"] % world_size:
        return f"seq = {size['seq']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any batch and head
    count, a sequence in multiples of W (the rule), a head_dim in multiples of 16 (80, 96, ...)."""
    return {
        "batch": draw("batch", 1, 24),
        "seq": draw("seq", world_size, 32, world_size),
        "heads": draw("heads", 1, 12),
        "head_dim": draw("head_dim", 32, 128, 16),
    }


def make_inputs(ctx):
    """q_local, k_local ~ N(0, 1), different per rank; cos/sin of random angles for these positions."""
    batch, seq, heads, head_dim = (ctx.size[k] for k in ("batch", "seq", "heads", "head_dim"))
    seq_local = seq // ctx.world_size
    q_local = ctx.randn(batch, seq_local, heads, head_dim)
    k_local = ctx.randn(batch, seq_local, heads, head_dim)
    # cos/sin in float64: two makes of one seed once differed here (1 run in several of
    # test_problems); the likely cause, float32 cos/sin differing by an ulp between a vectorized and
    # a scalar path, which bf16 rounding can expose, has no room to act in float64
    angles = ctx.rand(batch, seq_local, head_dim // 2, low=0.0, high=2 * math.pi, dtype=torch.float64)
    angles = torch.cat((angles, angles), dim=-1)
    return q_local, k_local, angles.cos().to(ctx.dtype), angles.sin().to(ctx.dtype)


def solution(q_local, k_local, cos_local, sin_local):
    w = dist.get_world_size()
    half = q_local.shape[-1] // 2
    qk = torch.stack((q_local, k_local))  # [2, B, S/W, H, D]: one pass of RoPE and one gather for both
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    embedded = qk * cos_local.unsqueeze(2) + rotated * sin_local.unsqueeze(2)
    two, batch, seq_local, heads, head_dim = embedded.shape
    gathered = embedded.new_empty(w * two, batch, seq_local, heads, head_dim)
    _all_gather(gathered, embedded)
    gathered = gathered.view(w, two, batch, seq_local, heads, head_dim)
    out = gathered.permute(1, 2, 0, 3, 4, 5).reshape(two, batch, w * seq_local, heads, head_dim)
    return out[0], out[1]


def traffic(ctx):
    """Per GPU: its embedded q and k shards go to each of the W-1 peers.

    HBM: read q_local, k_local and half of each table (the other half repeats it), write the two
    gathered [B, S, H, D] outputs.
    """
    w = ctx.world_size
    batch, seq, heads, head_dim = (ctx.size[k] for k in ("batch", "seq", "heads", "head_dim"))
    local = batch * (seq // w) * heads * head_dim
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * 2 * local * isz,
        "hbm_bytes": (2 * local + batch * (seq // w) * head_dim + 2 * w * local) * isz,
        "flops": 2 * 3 * local,  # two multiplies and an add per element of q and k
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(q_local: torch.Tensor, k_local: torch.Tensor, cos_local: torch.Tensor, "
        "sin_local: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]"
    ),
    "args": lambda inputs, env: inputs,
}
