import torch
import torch.distributed as dist
from torch import Tensor


def solution(flat_param_shard: Tensor, amax_history: Tensor) -> tuple[Tensor, Tensor]:
    amax = flat_param_shard.abs().amax().float().reshape(1)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX)
    scale = 448.0 / amax_history.amax()  # delayed scaling: this step's scale comes from the history
    codes = (flat_param_shard.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    parts = [torch.empty_like(codes.view(torch.uint8)) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, codes.view(torch.uint8))
    out = (torch.cat(parts).view(torch.float8_e4m3fn).float() / scale).to(flat_param_shard.dtype)
    return out, torch.cat([amax.to(amax_history.dtype), amax_history[:-1]])
