from typing import Optional, Tuple

import torch
import torch.distributed as dist


def solution(
    loss: torch.Tensor,
    local_valid_tokens: torch.Tensor,
    global_valid_tokens: torch.Tensor,
    grad_normalized_loss: torch.Tensor,
    grad_loss_sum: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = dist.get_world_size() / global_valid_tokens.float()
    normalized = loss * scale
    total = loss.float().clone()
    dist.all_reduce(total)
    grad = grad_normalized_loss * scale
    return (total / global_valid_tokens).to(loss.dtype), normalized.to(loss.dtype), grad.to(loss.dtype)
