"""SigLIP's sigmoid contrastive loss over a data-parallel batch (OpenCLIP, neighbour exchange).

Each rank holds n image and n text embeddings of its own pairs, image_features and text_features bf16
[n, dim], L2-normalized rows; pair i of rank r is image i with text i of rank r. Every rank must return
the loss of its own images against every text of every rank, as OpenCLIP's SigLipLoss returns it on
each rank, a bf16 scalar:

  z[i, j]  = logit_scale * <image_i, text_j> + logit_bias        (j over all W*n texts)
  loss     = (1/n) * ( sum over i, j of softplus(z[i, j])  -  sum over own pairs i of z[i, i] ),

that is -log sigmoid(z) for the n matching pairs and -log sigmoid(-z) for every other pair, summed and
divided by the local batch size n. OpenCLIP passes the texts around a bidirectional ring of neighbour
exchanges in W - 1 steps (W/2 with both directions); the reference all-gathers the texts once and
computes the rank's [n, W*n] logits in one product: the logits in float32 (the products of bf16
features are exact in float32, the sums float32), softplus and the sums in float32, the loss rounded
to bf16 once.

Inputs: embeddings drawn around 16 shared cluster centres (image = centre + noise, text = image +
smaller noise, both normalized), each rank with its own random mix of clusters (Dirichlet weights), so
that the negatives from other ranks carry a large, rank-dependent part of the loss (10-15% at W = 2, a
third at W = 4, 60% at W = 8): a rank that skips or estimates the other ranks' texts is far off.
logit_scale = 10 and logit_bias = -10 are SigLIP's initial values.

Source: OpenCLIP `SigLipLoss` with `dist_impl="bidir"` (ParallelKernelBench problem 58). The signature
and the call (image_features, text_features, logit_scale, logit_bias, None) are the original's; group
None is the default group.

Differences from the original: the embeddings are clustered with rank-specific mixes instead of
independent random directions (with those, every negative has z close to logit_bias and the other
ranks' part of the loss is nearly a constant that needs no communication); the reference computes in
float32 and rounds once, where OpenCLIP with bf16 features computes the logits in bf16 (its result
stays within the tolerance); each rank holds n = 128 embeddings at any W, the original's at world size
8 only (the original splits a batch of 1024: n = 1024 / W, 512 at W = 2).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 58
NAME = "openclip_contrastive_loss"
CATEGORY = "DP"
SOURCE = "OpenCLIP SigLIP loss with neighbour exchange (SigLipLoss, bidir)"
SUMMARY = (
    "SigLIP sigmoid loss of bf16 image/text embeddings [n, dim] against every rank's texts; bf16 scalar."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # n: image-text pairs per rank; dim: embedding width
    "pkb": {"n": 128, "dim": 1024},
    # [16384, 32768] float32 logits per rank at W = 2 (2 GiB; 275 GFLOP of bf16 products and a few
    # passes over the logits: a few ms on an H200, an estimate until measured)
    "large": {"n": 16384, "dim": 1024},
}
LOGIT_SCALE = 10.0
LOGIT_BIAS = -10.0
CLUSTERS = 16
# The loss is a bf16 scalar of about 1.5-10 (one bf16 unit: 0.0078-0.0625). Measured on CPU (W = 2, 4;
# 3 trials): a float64 solution lands on the same bf16 value or the next; OpenCLIP's own bf16
# arithmetic (bf16 logits, its ring of W - 1 exchanges) by one bf16 unit at most (0.031 on a loss of 5,
# 0.6%). Two units at a loss near 8 (W = 8) are 1.6%: hence 2%. Skipping the other ranks' texts is off
# by 10% or more.
TOLERANCE = {"atol": 0.02, "rtol": 0.02, "rel_norm": 0.02}

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_mm_out_dtype = [True]  # whether torch.mm takes out_dtype on this build (CUDA, torch >= 2.8)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): pairs per rank a
    multiple of 8, embedding widths of 64s."""
    return {"n": draw("n", 32, 256, 8), "dim": draw("dim", 256, 1536, 64)}


def make_inputs(ctx):
    """The original's call: this rank's image and text embeddings, logit_scale, logit_bias, None.

    Cluster centres are shared by all ranks; each rank draws its own mix of clusters (Dirichlet(0.5)
    weights), cluster of each pair, and noise: image = normalize(centre + 0.5 g / sqrt(dim)),
    text = normalize(image + 0.3 g' / sqrt(dim)).
    """
    n, dim = ctx.size["n"], ctx.size["dim"]
    if ctx.is_meta:
        return ctx.randn(n, dim), ctx.randn(n, dim), LOGIT_SCALE, LOGIT_BIAS, None
    centres = F.normalize(ctx.randn(CLUSTERS, dim, dtype=torch.float32, shared=True), dim=-1)
    mix = ctx.randn(CLUSTERS, dtype=torch.float64).square()  # Gamma(1/2) weights: Dirichlet(1/2) mixes
    u = ctx.rand(n, dtype=torch.float64)
    cluster = torch.searchsorted(mix.cumsum(0) / mix.sum(), u).clamp_max(CLUSTERS - 1)
    image = centres[cluster] + ctx.randn(n, dim, dtype=torch.float32, scale=0.5 / math.sqrt(dim))
    image = F.normalize(image, dim=-1)
    text = F.normalize(image + ctx.randn(n, dim, dtype=torch.float32, scale=0.3 / math.sqrt(dim)), dim=-1)
    return image.to(ctx.dtype), text.to(ctx.dtype), LOGIT_SCALE, LOGIT_BIAS, None


def _matmul_f32(a, b):
    """a @ b of bf16 [i, k] and [k, j]: exact products, float32 sums and result."""
    if a.is_cuda and _mm_out_dtype[0]:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (TypeError, RuntimeError):  # an older torch: the float32 product gives the same result
            _mm_out_dtype[0] = False
    return torch.mm(a.float(), b.float())


def solution(image_features, text_features, logit_scale, logit_bias=0.0, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    n, dim = text_features.shape
    texts = text_features.new_empty(w * n, dim)
    _all_gather(texts, text_features.contiguous(), group=group)
    z = _matmul_f32(image_features, texts.T).mul_(logit_scale).add_(logit_bias)  # [n, W*n] float32
    matching = z[:, rank * n : (rank + 1) * n].diagonal().sum()
    loss = (F.softplus(z).sum() - matching) / n
    return loss.to(image_features.dtype)


def traffic(ctx):
    """Per GPU: its texts to each of the W - 1 others, and theirs in.

    Every image must meet every text: either the texts travel ((W-1) n dim bf16 values in and out per
    rank, one round) or the images do and a partial loss comes back (the same bytes plus a scalar);
    no schedule moves less. Memory: read the rank's embeddings once. FLOPs: the [n, dim] x [dim, W n]
    product and a few operations per logit.
    """
    w = ctx.world_size
    n, dim = ctx.size["n"], ctx.size["dim"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * n * dim * isz,
        "hbm_bytes": 2 * n * dim * isz,
        "flops": 2 * n * w * n * dim + 4 * n * w * n,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(image_features, text_features, logit_scale, logit_bias=0.0, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the embeddings are clustered with rank-specific mixes instead of independent random directions "
        "(with those, every negative has z close to logit_bias and the other ranks' part of the loss is "
        "nearly a constant that needs no communication); the reference computes in float32 and rounds "
        "once, where OpenCLIP with bf16 features computes the logits in bf16 (its result stays within the"
        " tolerance); each rank holds n = 128 embeddings at any W, the original's at world size 8 only "
        "(the original splits a batch of 1024: n = 1024 / W, 512 at W = 2)."
    ),
}
