"""Problem 25 without the exchange: each rank's means and extremes over its own tokens only. It must
fail: every rank's hidden-state scale and advantage offset lie in a band of its own."""

import torch
import torch.nn.functional as F


def solution(hidden_states, weight, labels, old_logprobs, advantages, ignore_index=-100):
    logits = F.linear(hidden_states, weight).float()
    ce = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
    valid = labels != ignore_index
    delta = (-ce - old_logprobs).masked_fill(~valid, 0.0).clamp(-20.0, 20.0)
    ratio = delta.exp()
    pg = -(ratio * advantages).masked_fill(~valid, 0.0)
    n = valid.sum().clamp(min=1)
    r = ratio[valid]
    metrics = torch.stack(
        [r.sum() / n, r.min(), r.max(), (r - delta[valid] - 1.0).sum() / n, ce[valid].sum() / n]
    )
    return pg.sum() / n, None, -ce, pg, metrics
