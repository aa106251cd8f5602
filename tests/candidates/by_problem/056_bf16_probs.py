"""Problem 56 as 056_original_style.py, with flash attention's rounding (our own code): each block's
probabilities are rounded to bf16 before the product with v, an error of up to 2^-9 of sum |p v|. It
is a correct solution and must pass."""

import torch
import torch.distributed as dist


def _block(q, k, v, scale, mask):
    scores = q.float().transpose(1, 2) @ k.float().transpose(1, 2).transpose(-1, -2) * scale
    if mask:
        s = scores.shape[-1]
        scores = scores.masked_fill(
            torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf")
        )
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse).to(torch.bfloat16).float() @ v.float().transpose(1, 2), lse


def ring_attention(q, k, v, scale, causal, group):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    out = lse = None
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for step in range(n):
        if step + 1 < n:
            k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k_cur, ranks[(rank + 1) % n], group),
                    dist.P2POp(dist.isend, v_cur, ranks[(rank + 1) % n], group),
                    dist.P2POp(dist.irecv, k_next, ranks[(rank - 1) % n], group),
                    dist.P2POp(dist.irecv, v_next, ranks[(rank - 1) % n], group),
                ]
            )
        src = (rank - step) % n
        if not causal or src <= rank:
            o, blse = _block(q, k_cur, v_cur, scale, causal and src == rank)
            if out is None:
                out, lse = o, blse
            else:
                new = torch.logaddexp(lse, blse)
                out = out * torch.exp(lse - new) + o * torch.exp(blse - new)
                lse = new
        if step + 1 < n:
            for req in reqs:
                req.wait()
            k_cur, v_cur = k_next, v_next
    return out.transpose(1, 2)


def _layer(x, w_qkv, w_o, num_heads, scale, causal, group):
    b, s, hidden = x.shape
    d = hidden // num_heads
    scale = scale if scale is not None else d**-0.5
    q, k, v = (x @ w_qkv.T).view(b, s, 3, num_heads, d).unbind(2)
    ctx = ring_attention(q, k, v, scale, causal, group).to(x.dtype)
    return ctx.reshape(b, s, hidden) @ w_o.T


def solution(
    hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False, cp_group=None, pp_group=None
):
    stage = dist.get_rank(pp_group)
    peer = dist.get_global_rank(pp_group, 1 - stage)
    if stage == 0:
        out = _layer(hidden_states, w_qkv, w_o, num_heads, softmax_scale, causal, cp_group)
        dist.send(out, peer)
        return out
    received = torch.empty_like(hidden_states)
    dist.recv(received, peer)
    return _layer(received, w_qkv, w_o, num_heads, softmax_scale, causal, cp_group)
