"""Problem 75 written as a file for the original benchmark would be (our own code): Gated DeltaNet with
Ulysses-style context parallelism, called with the original's (q, k, v, gate, beta, a_log, dt_bias,
None).

Five all-to-alls (q, k, v, gate, beta) from a token split to a head split, the gated delta rule step by
step over the whole sequence in float32, and an all-to-all back. It must pass unchanged.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _to_heads(x, group):
    w = dist.get_world_size(group)
    b, n, h = x.shape[:3]
    rest = x.shape[3:]
    send = x.reshape(b, n, w, h // w, *rest).movedim(2, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.movedim(0, 1).reshape(b, w * n, h // w, *rest)


def _to_tokens(x, group):
    w = dist.get_world_size(group)
    b, s, hl, d = x.shape
    send = x.reshape(b, w, s // w, hl, d).movedim(1, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // w, w * hl, d)


@torch.no_grad()
def solution(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor,
    beta: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    group = group or dist.group.WORLD
    qh, kh, vh = (_to_heads(t, group) for t in (q, k, v))
    gh, bh = (_to_heads(t, group) for t in (gate, beta))
    b, s, hl, kd = qh.shape
    qf = F.normalize(qh.float(), dim=-1, eps=1e-6) * kd**-0.5
    kf = F.normalize(kh.float(), dim=-1, eps=1e-6)
    decay = torch.exp(-a_log.float().exp() * F.softplus(gh.float() + dt_bias.float()))
    state = torch.zeros(b, hl, kd, vh.shape[-1])
    out = torch.empty(b, s, hl, vh.shape[-1])
    for t in range(s):
        state = state * decay[:, t, :, None, None]
        kt = kf[:, t]
        u = (vh[:, t].float() - torch.einsum("bhk,bhkv->bhv", kt, state)) * bh[:, t].float()[..., None]
        state = state + kt[..., None] * u[..., None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", qf[:, t], state)
    return _to_tokens(out.to(q.dtype), group)
