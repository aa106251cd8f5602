import torch.distributed as dist
from torch import Tensor


def solution(
    grad_shard: Tensor,
    master_shard: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
) -> Tensor:
    g = grad_shard.to(exp_avg.dtype)
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)  # the optimizer state is updated in place
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(eps)
    master_shard.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
    params = grad_shard.new_empty(dist.get_world_size() * master_shard.numel())
    dist.all_gather_into_tensor(params, master_shard.to(grad_shard.dtype))
    return params
