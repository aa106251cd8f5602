"""Problem 75 without the head exchange (wrong: fails): every rank runs every head over its own tokens
from a zero state, which the original's inputs would allow (their decay of ~0.5 per step forgets the
earlier ranks' tokens within ~30 steps). Here the state carries them, and the outputs differ."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(q, k, v, gate, beta, a_log, dt_bias, group=None):
    w = dist.get_world_size(group)
    # every head's a_log and dt_bias: one all-gather of the per-rank slices (a few bytes)
    params = torch.stack([a_log, dt_bias]).contiguous()
    every = params.new_empty(w * 2, a_log.shape[0])
    dist.all_gather_into_tensor(every, params, group=group)
    a_all, dt_all = every.view(w, 2, -1).transpose(0, 1).reshape(2, -1)
    b, n, h, kd = q.shape
    qf = F.normalize(q.float(), dim=-1, eps=1e-6) * kd**-0.5
    kf = F.normalize(k.float(), dim=-1, eps=1e-6)
    decay = torch.exp(-a_all.float().exp() * F.softplus(gate.float() + dt_all.float()))
    state = torch.zeros(b, h, kd, v.shape[-1])
    out = torch.empty(b, n, h, v.shape[-1])
    for t in range(n):
        state = state * decay[:, t, :, None, None]
        u = (v[:, t].float() - torch.einsum("bhk,bhkv->bhv", kf[:, t], state)) * beta[:, t].float()[..., None]
        state = state + kf[:, t, ..., None] * u[..., None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", qf[:, t], state)
    return out.to(q.dtype)
