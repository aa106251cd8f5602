"""Problem 54 written as a file for the original benchmark would be (our own code): ring attention as
ring-flash-attention runs it, called with the original's (q, k, v, None, True, None).

W - 1 steps around a ring (send this step's k, v to the next rank, receive the previous rank's), each
step's block attention in float32 with its log-sum-exp, merged into the running output and log-sum-exp;
with the causal mask, blocks from later ranks are skipped and the rank's own block is masked. It must
pass unchanged.
"""

import torch
import torch.distributed as dist


def _block(q, k, v, scale, causal):
    # [B, S, H, D] -> float32 out [B, S, H, D] and lse [B, H, S]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) * scale
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(
            torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf")
        )
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ vf
    return out.transpose(1, 2), lse


def solution(q, k, v, softmax_scale=None, causal=False, group=None):
    group = group or dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = None, None
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for step in range(world):
        if step + 1 != world:
            k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
            ops = [
                dist.P2POp(dist.isend, k_cur, ranks[(rank + 1) % world], group),
                dist.P2POp(dist.isend, v_cur, ranks[(rank + 1) % world], group),
                dist.P2POp(dist.irecv, k_next, ranks[(rank - 1) % world], group),
                dist.P2POp(dist.irecv, v_next, ranks[(rank - 1) % world], group),
            ]
            reqs = dist.batch_isend_irecv(ops)
        if not causal or step <= rank:
            block_out, block_lse = _block(q, k_cur, v_cur, scale, causal and step == 0)
            if out is None:
                out, lse = block_out, block_lse
            else:
                new_lse = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1) + block_out * torch.exp(
                    block_lse - new_lse
                ).transpose(1, 2).unsqueeze(-1)
                lse = new_lse
        if step + 1 != world:
            for req in reqs:
                req.wait()
            k_cur, v_cur = k_next, v_next
    return out.to(q.dtype)
