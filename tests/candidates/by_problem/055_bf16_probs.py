"""Problem 55 as 055_original_style.py, with flash attention's rounding (our own code): each block's
probabilities are rounded to bf16 before the product with v, an error of up to 2^-9 of sum |p v|. It
is a correct solution and must pass."""

import torch
import torch.distributed as dist


def _block(q, k, v, scale, mask):
    # [B, S, h, D] bf16 -> float32 out [B, h, S, D] and lse [B, h, S, 1]
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
    return out.transpose(1, 2)  # [B, S, h, D] float32


def solution(
    hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False, tp_group=None, cp_group=None
):
    b, s = hidden_states.shape[:2]
    heads = num_heads // dist.get_world_size(tp_group)
    d = w_qkv.shape[0] // (3 * heads)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    q, k, v = (hidden_states @ w_qkv.T).view(b, s, 3, heads, d).unbind(2)
    ctx = ring_attention(q, k, v, scale, causal, cp_group).to(hidden_states.dtype)
    out = ctx.reshape(b, s, heads * d) @ w_o.T
    dist.all_reduce(out, group=tp_group)
    return out
