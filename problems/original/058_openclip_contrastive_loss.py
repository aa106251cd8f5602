"""The original benchmark's problem 58, exactly: OpenCLIP's SigLIP loss with the text features passed
around the ranks (neighbour exchange).

As the original's input builder makes them (a seed per rank): image_features and text_features
[1024 / W, 1024], standard normal bf16 rows normalized to unit length; it is called as
solution(image_features, text_features, 10.0, -10.0, None) (logit scale 10, bias -10, the WORLD
group). Each rank computes, in bf16, the SigLIP loss of its images against its own texts
(-sum log sigmoid(label * logits) / B, logits = 10 image @ text^T - 10, label +1 on the diagonal and
-1 elsewhere) and adds, for every other rank's texts, the negatives-only loss (-sum log sigmoid
(-logits) / B), in OpenCLIP's neighbour-exchange order (the texts of ranks r + 1, r - 1, r + 2,
r - 2, ..., then the last one from the left when W - 1 is odd): it returns its loss, a bf16 scalar.
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).

What a solution could skip: the exchange. Random unit vectors in 1024 dimensions are nearly
orthogonal, so every negative logit is about -10 and adds about exp(-10) = 4.5e-5: another rank's
texts add about 1024 / W * 4.5e-5 to a loss of about 10, whose tolerance is 0.11 (and a bf16 unit
at 10 is 0.06). A rank that returns its own loss passes: at W = 2, in 3 trials on CPU, it
returned the very bf16 value of the reference, the other rank's share being below half a unit.
The `pkb` variant (clustered embeddings, so that the other ranks' texts carry 10-60% of the loss)
was redesigned for this.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 58
NAME = "openclip_contrastive_loss"
CATEGORY = "DP"
SOURCE = "OpenCLIP SigLIP loss with neighbour exchange (SigLipLoss, bidir)"
SUMMARY = "SigLIP loss of bf16 unit features [1024 / W, 1024] against every rank's texts (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "random unit vectors are nearly orthogonal: another rank's texts move a loss of about 10 by far "
    "less than its tolerance"
)
SIZES = {"pkb": {"m": 1024, "dim": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
LOGIT_SCALE, LOGIT_BIAS = 10.0, -10.0

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: normalized standard normal features; scale 10, bias -10, group None."""
    rows = max(1, ctx.size["m"] // ctx.world_size)
    image = ctx.randn(rows, ctx.size["dim"])
    text = ctx.randn(rows, ctx.size["dim"])
    if not ctx.is_meta:
        image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    return image, text, LOGIT_SCALE, LOGIT_BIAS, None


def _loss(image, text, scale, bias, negative_only):
    batch = image.shape[0]
    logits = scale * image @ text.T + bias
    if negative_only:
        return -F.logsigmoid(-logits).sum() / batch
    labels = torch.full_like(logits, -1.0)
    labels.diagonal().fill_(1.0)
    return -F.logsigmoid(labels * logits).sum() / batch


@torch.no_grad()
def solution(image_features, text_features, logit_scale, logit_bias=0.0, group=None):
    group = group or dist.group.WORLD
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    texts = text_features.new_empty(w * text_features.shape[0], text_features.shape[1])
    _all_gather(texts, text_features.contiguous(), group=group)
    texts = texts.view(w, *text_features.shape)
    loss = _loss(image_features, text_features, logit_scale, logit_bias, False)
    pairs, odd = divmod(w - 1, 2)
    # the order in which the neighbour exchange delivers them, so the bf16 sums agree
    order = [src for i in range(1, pairs + 1) for src in ((rank + i) % w, (rank - i) % w)]
    order += [(rank - pairs - 1) % w] if odd else []
    for src in order:
        loss = loss + _loss(image_features, texts[src], logit_scale, logit_bias, True)
    return loss


def traffic(ctx):
    """Per GPU, each direction: its texts to each of the W - 1 others (or, the same, their images
    from each: the loss needs every pair). FLOPs: the [B, B] logits against every rank's texts.
    Memory: read the features, the others' texts once."""
    w, dim = ctx.world_size, ctx.size["dim"]
    rows = max(1, ctx.size["m"] // w)
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) * rows * dim * isz,
        "hbm_bytes": (w + 1) * rows * dim * isz,
        "flops": 2 * w * rows * rows * dim,
        "rounds": 1,
    }
