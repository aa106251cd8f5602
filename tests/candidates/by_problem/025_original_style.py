"""Problem 25 in the original benchmark's convention, the way an RL trainer writes its token-level
policy-gradient loss: bf16 logits and cross entropy, the valid-token count and each sum or extreme
all-reduced on its own, metrics stacked at the end. Called as solution(hidden_states, weight, labels,
old_logprobs, advantages, -100). Its per-token outputs are bf16, so it passes the `original` variant
and fails pkb's on their dtype (pkb's log-probabilities are float32)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _all_reduce(value, op=dist.ReduceOp.SUM):
    dist.all_reduce(value, op=op)
    return value


def solution(hidden_states, weight, labels, old_logprobs, advantages, ignore_index=-100):
    logits = F.linear(hidden_states, weight)
    targets = labels.reshape(-1)
    nll = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets, ignore_index=ignore_index, reduction="none"
    )
    mask = targets != ignore_index
    num_tokens = _all_reduce(mask.sum().float()).clamp(min=1.0)
    log_ratio = torch.where(mask, -nll - old_logprobs.reshape(-1), 0.0).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    pg_losses = torch.where(mask, -ratio * advantages.reshape(-1), 0.0)
    pg_loss = _all_reduce(pg_losses.sum()) / num_tokens
    surrogate = (torch.where(mask, ratio * advantages.reshape(-1), 0.0) * nll).sum() / num_tokens
    loss = pg_loss + surrogate - surrogate
    metrics = torch.stack(
        [
            _all_reduce(torch.where(mask, ratio, 0.0).sum()) / num_tokens,
            _all_reduce(torch.where(mask, ratio, float("inf")).min(), dist.ReduceOp.MIN),
            _all_reduce(torch.where(mask, ratio, float("-inf")).max(), dist.ReduceOp.MAX),
            _all_reduce(torch.where(mask, ratio - log_ratio - 1.0, 0.0).sum()) / num_tokens,
            _all_reduce(torch.where(mask, nll, 0.0).sum()) / num_tokens,
        ]
    )
    return loss, None, (-nll).view_as(labels), pg_losses.view_as(labels), metrics
