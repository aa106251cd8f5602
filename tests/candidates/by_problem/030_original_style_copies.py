"""030_original_style.py with one change: each gradient is all-reduced in a copy, and the copies are
returned (three all-reduces, no packing), the inputs left as they were. It must fail: the workload
sums in place, and the inputs after the call are judged too."""

import torch.distributed as dist


def solution(grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B, group=None):
    sums = [g.clone() for g in (grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B)]
    for grad in sums:
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
    return tuple(sums)
