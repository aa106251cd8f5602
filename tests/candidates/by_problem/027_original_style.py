"""Problem 27 in the original benchmark's convention, the way VeOmni's EP all_to_all goes: split sizes
as lists or tensors (a tensor's total read on the host), an output sized by the output splits, one
all_to_all_single. Called as solution(local_tensor, input_split_sizes, output_split_sizes, None); it
passes both variants unchanged."""

import torch
import torch.distributed as dist


def solution(local_tensor, input_split_sizes=None, output_split_sizes=None, group=None):
    group = group or dist.group.WORLD
    if dist.get_world_size(group) == 1:
        return local_tensor.contiguous()
    if output_split_sizes is None:
        output = torch.empty_like(local_tensor)
    else:
        if isinstance(output_split_sizes, torch.Tensor):
            output_split_sizes = output_split_sizes.tolist()
        if isinstance(input_split_sizes, torch.Tensor):
            input_split_sizes = input_split_sizes.tolist()
        output = local_tensor.new_empty((sum(output_split_sizes), *local_tensor.shape[1:]))
    dist.all_to_all_single(
        output, local_tensor.contiguous(), output_split_sizes, input_split_sizes, group=group
    )
    return output
