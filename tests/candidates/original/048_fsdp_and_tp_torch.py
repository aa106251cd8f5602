import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def _gather(shard, group, n):
    parts = [torch.empty_like(shard) for _ in range(n)]
    dist.all_gather(parts, shard, group=group)
    return torch.cat(parts)


def solution(
    x_local: Tensor, W1_shard: Tensor, W2_shard: Tensor, W3_shard: Tensor, n_tp: int, n_fsdp: int
) -> Tensor:
    r = dist.get_rank()
    tp_group = fsdp_group = None
    for f in range(n_fsdp):
        g = dist.new_group([f * n_tp + t for t in range(n_tp)])
        tp_group = g if r // n_tp == f else tp_group
    for t in range(n_tp):
        g = dist.new_group([f * n_tp + t for f in range(n_fsdp)])
        fsdp_group = g if r % n_tp == t else fsdp_group
    w1 = _gather(W1_shard, fsdp_group, n_fsdp)
    w2 = _gather(W2_shard, fsdp_group, n_fsdp)
    w3 = _gather(W3_shard.t().contiguous(), fsdp_group, n_fsdp).t()
    y = (F.silu(x_local @ w1) * (x_local @ w2)) @ w3
    dist.all_reduce(y, group=tp_group)
    return y
