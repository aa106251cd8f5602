import torch
import torch.distributed as dist
from torch import Tensor


def solution(flat_grads: Tensor, amax_history: Tensor) -> tuple[Tensor, Tensor]:
    w = dist.get_world_size()
    amax = flat_grads.abs().amax().float().reshape(1)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX)
    scale = 448.0 / amax_history.amax()  # delayed scaling: this step's scale comes from the history
    codes = (flat_grads.float() * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    recv = torch.empty_like(codes)
    dist.all_to_all_single(recv.view(torch.uint8), codes.view(torch.uint8))
    out = (recv.float().view(w, -1).sum(dim=0) / scale).to(flat_grads.dtype)
    return out, torch.cat([amax.to(amax_history.dtype), amax_history[:-1]])
