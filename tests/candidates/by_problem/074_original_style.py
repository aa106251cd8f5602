"""Problem 74 written as a file for the original benchmark would be (our own code): Kimi Delta
Attention with context and tensor parallelism, called with the original's (q, k, v, g, beta, a_log,
dt_bias, cp_group, tp_group).

Five all-gathers over the CP group, the recurrence of the whole sequence step by step in float32, a
bf16 all-reduce over the TP group, and the rank's block of the result. It must pass unchanged.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _gather(x, group):
    w = dist.get_world_size(group)
    out = x.new_empty(w * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(out, x.transpose(0, 1).contiguous().transpose(0, 1), group=group)
    return out.view(w, *x.shape).movedim(0, 1).flatten(1, 2)


@torch.no_grad()
def solution(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    cp_group: dist.ProcessGroup | None = None,
    tp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    cp_group = cp_group or dist.group.WORLD
    qa, ka, va, ga, ba = (_gather(t, cp_group) for t in (q, k, v, g, beta))
    b, s, h, kd = qa.shape
    qf = F.normalize(qa.float(), dim=-1) * kd**-0.5
    kf = F.normalize(ka.float(), dim=-1)
    decay = torch.exp(
        -5.0 * torch.sigmoid(a_log.float().exp()[:, None] * (ga.float() + dt_bias.float().view(h, kd)))
    )
    bs = ba.float().sigmoid()
    state = torch.zeros(b, h, kd, va.shape[-1])
    out = torch.empty(b, s, h, va.shape[-1])
    for t in range(s):
        state = decay[:, t, :, :, None] * state
        kt = kf[:, t]
        u = (va[:, t].float() - torch.einsum("bhk,bhkv->bhv", kt, state)) * bs[:, t, :, None]
        state = state + kt[..., None] * u[..., None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", qf[:, t], state)
    out = out.to(q.dtype)
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(out, group=tp_group)
    n = q.shape[1]
    start = dist.get_rank(cp_group) * n
    return out[:, start : start + n].contiguous()
