"""Problem 54 with flash attention's rounding: the probabilities rounded to bf16 before the product
with v (float32 sums). A correct solution by the problem's tolerance: the rounding moves an output by
up to 2^-9 of the sum of |p v| over its keys. All-gathers k and v, one pass over the rank's rows.
"""

import torch
import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_bmm_out_dtype = [True]  # whether torch.bmm takes out_dtype on this build (CUDA, torch >= 2.8)


def _matmul_f32(a, b):
    """Batched a @ b of bf16 [n, i, k] and [n, k, j]: exact products, float32 sums and result."""
    if a.is_cuda and _bmm_out_dtype[0]:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # an older torch: the float32 product gives the same result
            _bmm_out_dtype[0] = False
    return torch.bmm(a.float(), b.float())


def solution(q, k, v, softmax_scale=None, causal=False, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, s_local, h, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d**-0.5

    # every rank's k and v: [W, 2, B, S_local, H, D]
    local = torch.stack([k, v])
    gathered = local.new_empty(w * 2, b, s_local, h, d)
    _all_gather(gathered, local, group=group)
    blocks = rank + 1 if causal else w
    kv = gathered.view(w, 2, b, s_local, h, d)[:blocks]
    # [2, B*H, blocks*S_local, D]: heads as the batch of the matrix products
    kv = kv.permute(1, 2, 4, 0, 3, 5).reshape(2, b * h, blocks * s_local, d)
    qh = q.permute(0, 2, 1, 3).reshape(b * h, s_local, d)

    scores = _matmul_f32(qh, kv[0].transpose(1, 2)).mul_(scale)  # [B*H, S_local, keys] float32
    if causal:
        diagonal = scores[:, :, rank * s_local :]
        above = torch.ones(s_local, s_local, dtype=torch.bool, device=q.device).triu_(1)
        diagonal.masked_fill_(above, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = _matmul_f32(probs, kv[1])  # [B*H, S_local, D] float32
    return out.to(q.dtype).view(b, h, s_local, d).transpose(1, 2).contiguous()
