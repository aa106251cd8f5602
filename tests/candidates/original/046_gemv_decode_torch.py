import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    hidden_states: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor
) -> torch.Tensor:
    logits = F.linear(hidden_states, weight_shard, bias_shard)
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, logits)
    return torch.cat(parts, dim=-1)
