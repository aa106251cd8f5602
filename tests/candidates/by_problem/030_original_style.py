"""Problem 30 in the original benchmark's convention, the way VeOmni synchronizes the LoRA gradients:
all-reduce each of the three in place and return them. Called as
solution(grad_fc1_1, grad_fc1_2, grad_fc2, None). It passes unchanged."""

import torch.distributed as dist


def solution(grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B, group=None):
    for grad in (grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B):
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
    return grad_fc1_1_lora_A, grad_fc1_2_lora_A, grad_fc2_lora_B
