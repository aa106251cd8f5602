"""Problem 29 in the original benchmark's convention, the way Megatron-LM's dispatcher combines: the
received chunks put back in sending-rank order with torch.split over the counts read on the host, one
all_to_all_single with the split lists reversed, then the weighted unpermute (the weights placed in a
[tokens, experts] table, selected in the routing map's order, each row scaled and scatter-added onto
its token in bf16). Called with the original's eleven arguments; it passes both variants unchanged."""

import torch
import torch.distributed as dist


def sort_chunks_by_idxs(input, split_sizes, sorted_idxs):
    chunks = torch.split(input, split_sizes.tolist(), dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


def unpermute(permuted_tokens, sorted_indices, restore_shape, probs, routing_map):
    permuted_probs = probs.T.contiguous().masked_select(routing_map)
    permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1)
    output = torch.zeros(restore_shape, dtype=permuted_tokens.dtype, device=permuted_tokens.device)
    output.scatter_add_(0, sorted_indices.unsqueeze(1).expand(-1, restore_shape[1]), permuted_tokens)
    return output


def solution(
    expert_outputs,
    routing_weights,
    selected_experts,
    num_experts,
    input_splits,
    output_splits,
    num_global_tokens_per_local_expert,
    routing_map,
    local_input_permutation_mapping,
    org_hidden_states_shape,
    group=None,
):
    ep_size = dist.get_world_size(group)
    num_local_experts = num_experts // ep_size
    restore_output_by_local_experts = (
        torch.arange(num_experts).reshape(num_local_experts, -1).T.ravel().tolist()
    )
    hidden_states = sort_chunks_by_idxs(
        expert_outputs, num_global_tokens_per_local_expert.T.ravel(), restore_output_by_local_experts
    )
    permutated_local_input_tokens = hidden_states.new_empty((sum(input_splits), hidden_states.shape[1]))
    dist.all_to_all_single(
        permutated_local_input_tokens, hidden_states, input_splits, output_splits, group=group
    )
    probs = torch.zeros(
        (routing_weights.shape[0], num_experts), dtype=routing_weights.dtype, device=routing_weights.device
    ).scatter(1, selected_experts, routing_weights)
    return unpermute(
        permutated_local_input_tokens,
        local_input_permutation_mapping,
        org_hidden_states_shape,
        probs,
        routing_map.bool(),
    )
