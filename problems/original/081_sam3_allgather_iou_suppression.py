"""The original benchmark's problem 81, exactly: SAM3's gather of uneven object masks and IoU suppression.

As the original's input builder makes them (a seed per rank): rank r holds n_r = 1 + (r + t) % 3
objects (t the original's trial; here drawn in 0 .. 2 by each trial's secret seed, the same on every
rank), low_res_masks_local bf16 [n_r, 256, 256] = standard normal + 4 where (y + x + i + r) % 5 == 0
(i the object's index on its rank) - 1, in bf16, and obj_scores_local = linspace(-5, 5, n_r) bf16;
every rank holds num_obj_per_gpu and last_occluded = (g % 5) - 1, int64 [T]. Called as
solution(masks, scores, num_obj_per_gpu, last_occluded, 0.7, False, None). Every rank returns every
object's logits as float32 [T, 256, 256] (-10 where suppressed), the float32 scores [T] and the
suppressed objects, bool [T]: of each pair i < j whose masks (logit > 0) overlap with IoU >= 0.7, the
one occluded more recently (larger last_occluded, the other's not -1). Judged as the original harness
judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).

What a solution could skip: the suppression. The masks are the pattern's fifth of the pixels plus
noise over 16% of the rest, so two objects overlap with IoU about 0.5 at most: nothing is ever
suppressed, and a solution that only gathers passes. The `pkb` variant's objects come in clusters
that overlap above 0.8.

The original's own reference all-gathers lists of tensors of unequal sizes, which NCCL takes and
gloo itself refuses ("invalid tensor size"); pkb's CPU ranks run that gather as NCCL does
(harness/gloo_as_nccl.py), and the reference passes this variant on CPU (W = 2, 2026-12-02).
"""

import math

import torch
import torch.distributed as dist

ID = 81
NAME = "sam3_allgather_iou_suppression"
CATEGORY = "vision"
SOURCE = "SAM3 multi-GPU video tracker (facebookresearch/sam3)"
SUMMARY = "All-gather 1-3 bf16 object masks [256, 256] per rank; IoU >= 0.7 suppression (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"height": 256, "width": 256}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
NO_OBJECT_LOGIT = -10.0


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def counts(world_size, trial):
    """The original's num_obj_per_gpu in its trial `trial`."""
    return [1 + (r + trial) % 3 for r in range(world_size)]


def make_inputs(ctx):
    """The original's: noise on a diagonal pattern, linspace scores, the counts, (g % 5) - 1, 0.7, False."""
    h, w = ctx.size["height"], ctx.size["width"]
    trial = 0 if ctx.is_meta else int(ctx.randint(0, 3, 1, shared=True))
    per_rank = counts(ctx.world_size, trial)
    n, total = per_rank[ctx.rank], sum(per_rank)
    masks = ctx.randn(n, h, w)
    yy = torch.arange(h, device=ctx.device).view(1, h, 1)
    xx = torch.arange(w, device=ctx.device).view(1, 1, w)
    centers = torch.arange(n, device=ctx.device).view(n, 1, 1)
    pattern = ((yy + xx + centers + ctx.rank) % 5 == 0).to(ctx.dtype)
    masks = masks + pattern * 4.0 - 1.0
    scores = torch.linspace(-5.0, 5.0, n, dtype=ctx.dtype, device=ctx.device)
    last = torch.arange(total, dtype=torch.long, device=ctx.device) % 5 - 1
    return masks.contiguous(), scores, per_rank, last, 0.7, False, None


def suppression(masks, last_occluded, iou_threshold, reverse):
    """bool [T]: the objects to suppress, from their logits [T, H, W] and last occlusions [T]."""
    binary = (masks > 0).flatten(1).float()
    inter = binary @ binary.T
    area = binary.sum(dim=1)
    iou = inter / (area[:, None] + area[None, :] - inter).clamp_min(1.0)
    overlaps = torch.triu(iou >= iou_threshold, diagonal=1)
    last = last_occluded.long()
    later = last[:, None] < last[None, :] if reverse else last[:, None] > last[None, :]
    seen = last > -1
    return (overlaps & later & seen[None, :]).any(dim=1) | (overlaps & later.T & seen[:, None]).any(dim=0)


def _all_gather_uneven(local, per_rank, group):
    longest = max(per_rank)
    pad = local.new_zeros(longest - local.shape[0], *local.shape[1:])
    out = local.new_empty(len(per_rank) * longest, *local.shape[1:])
    dist.all_gather_into_tensor(out, torch.cat([local, pad]).contiguous(), group=group)
    keep = torch.arange(longest, device=local.device) < torch.tensor(per_rank, device=local.device)[:, None]
    return out.view(len(per_rank), longest, *local.shape[1:])[keep]


@torch.no_grad()
def solution(
    low_res_masks_local,
    obj_scores_local,
    num_obj_per_gpu,
    last_occluded,
    iou_threshold=0.7,
    reverse=False,
    group=None,
):
    masks = _all_gather_uneven(low_res_masks_local, num_obj_per_gpu, group).float()
    scores = _all_gather_uneven(obj_scores_local, num_obj_per_gpu, group).float()
    suppressed = suppression(masks, last_occluded, iou_threshold, reverse)
    masks[suppressed] = NO_OBJECT_LOGIT
    return masks, scores, suppressed


def traffic(ctx):
    """Per GPU, the least: nothing is ever suppressed, so every rank receives every other rank's bf16
    logits and scores; a rank's own need leave it only once (peers may forward them, as in a ring),
    which no rank's receipt is below; the most over the ranks, in trial 0, the trial with the fewest
    objects (the floor holds for every trial's counts). HBM: the local logits read, the float32
    outputs written. FLOPs: one multiply-add a pixel for each of the T (T - 1) / 2 pairs'
    intersections, split over the ranks."""
    w, s = ctx.world_size, ctx.size
    pixels = s["height"] * s["width"]
    per_rank = counts(w, 0)
    total = sum(per_rank)
    obj = pixels * 2 + 2
    return {
        "nvlink_bytes": (total - min(per_rank)) * obj,
        "hbm_bytes": max(per_rank) * obj + total * (pixels * 4 + 5),
        "flops": total * (total - 1) * pixels / w,
        "rounds": 1,
    }
