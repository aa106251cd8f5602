"""The original benchmark's problem 71, exactly: a causal depthwise conv1d over zigzag sequence chunks.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds x
[1, 1024, 2048], its two zigzag chunks of 1024 positions side by side (global chunks r and 2W-1-r),
and its own weight [1024, 1, 7], standard normal (it differs from rank to rank), and is called as
solution(x, weight, None). Each chunk's first 6 outputs need the 6 columns before it: chunk r's from
rank r-1's first chunk (zeros on rank 0), chunk 2W-1-r's from rank r+1's second chunk (on rank W-1,
from its own first chunk). Every rank returns the bf16 depthwise convolution (no bias) of each halo
and chunk with its own weight, [1, 1024, 2048] in the same zigzag layout. Judged as the original
harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 71
NAME = "hyena_conv1d_boundary_exchange"
CATEGORY = "CP"
SOURCE = "Savanna / Evo 2 Hyena short convolution with zigzag context parallelism"
SUMMARY = "Causal depthwise conv1d (k=7) of bf16 zigzag chunks [1, 1024, 2048] per rank (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"batch": 1, "channels": 1024, "seq_local": 2048, "kernel": 7}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: this rank's two chunks and its own weight, standard normal; group None."""
    s = ctx.size
    return (
        ctx.randn(s["batch"], s["channels"], s["seq_local"]),
        ctx.randn(s["channels"], 1, s["kernel"]),
        None,
    )


@torch.no_grad()
def solution(x, weight, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, d, seq_local = x.shape
    halo, chunk = weight.shape[-1] - 1, seq_local // 2

    # every rank's two chunk tails, [W, 2, B, D, halo]
    tails = x.view(b, d, 2, chunk)[..., chunk - halo :].permute(2, 0, 1, 3).contiguous()
    gathered = tails.new_empty(w * 2, b, d, halo)
    dist.all_gather_into_tensor(gathered, tails, group=group)
    gathered = gathered.view(w, 2, b, d, halo)
    before_first = gathered[rank - 1, 0] if rank > 0 else torch.zeros_like(tails[0])
    before_second = gathered[rank + 1, 1] if rank < w - 1 else tails[0]

    # both chunks with their halos in the batch, one grouped convolution
    chunks = x.view(b, d, 2, chunk).permute(2, 0, 1, 3).reshape(2 * b, d, chunk)
    padded = torch.cat([torch.cat([before_first, before_second]), chunks], dim=-1)
    y = F.conv1d(padded, weight, groups=d)
    return y.view(2, b, d, chunk).permute(1, 2, 0, 3).reshape(b, d, seq_local)


def traffic(ctx):
    """Per GPU: two halos of k-1 columns out (the first chunk's tail to rank r+1, the second's to
    rank r-1) and two in. Memory: x read once, the output written once; k multiply-adds per output."""
    s = ctx.size
    b, d, seq_local, k = s["batch"], s["channels"], s["seq_local"], s["kernel"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * b * d * (k - 1) * isz,
        "hbm_bytes": 2 * b * d * seq_local * isz + d * k * isz,
        "flops": 2 * k * b * d * seq_local,
        "rounds": 1,
    }
