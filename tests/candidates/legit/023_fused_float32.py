"""Problem 23, correct another way: one float32 all-reduce of [gradient..., loss sum, token count],
the gradient scaled by 1 / N after the sum (the counts are exact in float32 below 2^24).

Expected: pass: the sum in float32 is more precise than the reference's bf16 all-reduce.
"""

import torch
import torch.distributed as dist


def solution(loss_sums, token_counts, grad_sums):
    w = dist.get_world_size()
    local_loss_sum = loss_sums.float().sum()
    buf = torch.cat([grad_sums.float(), local_loss_sum.reshape(1), token_counts.sum().float().reshape(1)])
    dist.all_reduce(buf)
    n = buf[-1]
    loss = (buf[-2] / n).to(torch.bfloat16).reshape(1)
    local_loss = (local_loss_sum * w / n).to(torch.bfloat16).reshape(1)
    return loss, local_loss, (buf[:-2] / n).to(torch.bfloat16)
