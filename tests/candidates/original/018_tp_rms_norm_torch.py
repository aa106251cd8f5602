import torch
import torch.distributed as dist


def solution(
    local_hidden_states: torch.Tensor, local_weight: torch.Tensor, variance_epsilon: float
) -> torch.Tensor:
    h = local_hidden_states.float()
    sum_sq = h.pow(2).sum(dim=-1, keepdim=True)
    dist.all_reduce(sum_sq)
    variance = sum_sq / (h.shape[-1] * dist.get_world_size())
    return (h * torch.rsqrt(variance + variance_epsilon) * local_weight.float()).to(local_hidden_states.dtype)
