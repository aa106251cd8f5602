import torch
import torch.distributed as dist


def solution(indices: torch.Tensor, local_shard: torch.Tensor) -> torch.Tensor:
    shards = [torch.empty_like(local_shard) for _ in range(dist.get_world_size())]
    dist.all_gather(shards, local_shard)  # the whole table on every rank: simple, not fast
    return torch.cat(shards)[indices]
