"""Problem 81 written in the original's convention, pair by pair: every rank's masks and scores,
float32, gathered as lists (padded to the largest count, since gloo's all_gather needs equal sizes),
then each pair i < j whose binary masks overlap with IoU >= the threshold suppresses the object
occluded more recently, one pair at a time. Called as the original harness calls it."""

import torch
import torch.distributed as dist

NO_OBJ_LOGIT = -10.0


def _gather(local: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    longest = max(counts)
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


def solution(
    low_res_masks_local,
    obj_scores_local,
    num_obj_per_gpu,
    last_occluded,
    iou_threshold=0.7,
    reverse=False,
    group=None,
):
    masks = _gather(low_res_masks_local.float(), num_obj_per_gpu, group)
    scores = _gather(obj_scores_local.float(), num_obj_per_gpu, group)
    binary = [m > 0 for m in masks]
    last = [int(v) for v in last_occluded]
    suppress = [False] * len(binary)
    for i in range(len(binary)):
        for j in range(i + 1, len(binary)):
            inter = float((binary[i] & binary[j]).sum())
            union = float(binary[i].sum() + binary[j].sum()) - inter
            if inter / max(union, 1.0) < iou_threshold:
                continue
            i_later = last[i] < last[j] if reverse else last[i] > last[j]
            j_later = last[j] < last[i] if reverse else last[j] > last[i]
            if i_later and last[j] > -1:
                suppress[i] = True
            if j_later and last[i] > -1:
                suppress[j] = True
    suppressed = torch.tensor(suppress, dtype=torch.bool, device=masks.device)
    masks[suppressed] = NO_OBJ_LOGIT
    return masks, scores, suppressed
