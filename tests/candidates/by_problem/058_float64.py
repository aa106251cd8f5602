"""Problem 58 in float64: an independent correct solution (the tolerance's basis). All-gathers the texts
with a list all-gather and computes -log sigmoid(label * z) with explicit labels in float64."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(image_features, text_features, logit_scale, logit_bias=0.0, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(text_features) for _ in range(world)]
    dist.all_gather(parts, text_features.contiguous(), group=group)
    n = image_features.shape[0]
    z = logit_scale * image_features.double() @ torch.cat(parts).double().T + logit_bias
    labels = -torch.ones_like(z)
    labels[:, rank * n : (rank + 1) * n] += 2 * torch.eye(n, dtype=z.dtype)
    return (-F.logsigmoid(labels * z).sum() / n).to(image_features.dtype)
