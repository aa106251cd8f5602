"""Problem 39 in the original benchmark's convention and with its flaw: after the Ulysses all-to-all
the heads are [B, S, H/W, D] and the scores are taken as q @ k^T on that layout, so the softmax runs
across the heads of one position instead of across the sequence (with one head per rank it is 1 and
the layer returns V through the output projection). Called as the original harness calls it:
(hidden_states, w_qkv, w_o, None, num_heads, False). ATTEND_OVER = "sequence" moves the softmax to
the keys (the fix), and then the file passes."""

import math

import torch
import torch.distributed as dist

ATTEND_OVER = "heads"


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    world_size = dist.get_world_size(group)
    inputs = [t.contiguous() for t in torch.tensor_split(x, world_size, scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world_size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim).contiguous()


def solution(
    hidden_states: torch.Tensor,
    w_qkv: torch.Tensor,
    w_o: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    num_heads: int = 8,
    causal: bool = False,
) -> torch.Tensor:
    batch, seq_local, hidden = hidden_states.shape
    head_dim = hidden // num_heads
    qkv = torch.matmul(hidden_states, w_qkv.t()).view(batch, seq_local, 3, num_heads, head_dim)
    qkv = _all_to_all(qkv, 3, 1, group)  # [B, S, 3, H/W, D]
    q, k, v = qkv.unbind(dim=2)
    if ATTEND_OVER == "sequence":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H/W, S, D]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)
    if causal and ATTEND_OVER == "sequence":
        n = scores.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    if ATTEND_OVER == "sequence":
        out = out.transpose(1, 2)  # back to [B, S, H/W, D]
    out = _all_to_all(out.contiguous(), 1, 2, group)  # [B, s, H, D]
    return torch.matmul(out.reshape(batch, seq_local, hidden), w_o.t())
