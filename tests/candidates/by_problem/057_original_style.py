"""Problem 57 written as a file for the original benchmark would be (our own code): the original's
signature and call (dout, q, k, v, out, softmax_lse, None, False, cp_group, dp_group); the ring
backward of ring-flash-attention: k and v travel around the CP ring with float32 dk, dv accumulators,
each rank adds its queries' contributions to them and to its own dq, and after W/2 hops every block's
accumulators are home; then dq, dk, dv are averaged over the DP group. It must pass unchanged."""

import torch
import torch.distributed as dist


def _ring_pass(tensors, group):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensors
    ranks = dist.get_process_group_ranks(group)
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, ranks[(rank + 1) % n], group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, ranks[(rank - 1) % n], group) for t in received]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return received


def solution(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False, cp_group=None, dp_group=None):
    n, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    s_l = q.shape[1]
    qf, dof = q.float().transpose(1, 2), dout.float().transpose(1, 2)  # [B, H, S, D]
    delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).unsqueeze(-1)  # [B, H, S, 1]
    lse = softmax_lse.unsqueeze(-1)
    dq = torch.zeros_like(qf)
    k_cur, v_cur = k.contiguous(), v.contiguous()
    dk_acc = torch.zeros(k.transpose(1, 2).shape, dtype=torch.float32, device=k.device)
    dv_acc = torch.zeros_like(dk_acc)
    for step in range(n):
        src = (rank - step) % n
        if not causal or src <= rank:
            kf, vf = k_cur.float().transpose(1, 2), v_cur.float().transpose(1, 2)
            p = torch.exp(qf @ kf.transpose(-1, -2) * scale - lse)
            if causal and src == rank:
                p = p.masked_fill(torch.ones(s_l, s_l, dtype=torch.bool, device=q.device).triu(1), 0.0)
            ds = p * (dof @ vf.transpose(-1, -2) - delta)
            dq += ds @ kf * scale
            dk_acc = dk_acc + ds.transpose(-1, -2) @ qf * scale
            dv_acc = dv_acc + p.transpose(-1, -2) @ dof
        k_cur, v_cur, dk_acc, dv_acc = _ring_pass([k_cur, v_cur, dk_acc, dv_acc], cp_group)
    grads = torch.stack([dq, dk_acc, dv_acc])
    dist.all_reduce(grads, group=dp_group)
    grads = (grads / dist.get_world_size(dp_group)).transpose(2, 3).to(q.dtype)
    return grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous()
