"""Problem 28 in the original benchmark's convention, the way Megatron-LM's dispatcher goes: the routing
map from the mask, tokens permuted expert-major with masked_select, one all_to_all_single with the
split lists, and the received chunks regrouped by local expert with torch.split over the counts read
on the host. Called as solution(hidden_states, expert_mask, num_experts, input_splits, output_splits,
num_global_tokens_per_local_expert, None); it passes both variants unchanged."""

import torch
import torch.distributed as dist


def sort_chunks_by_idxs(input, split_sizes, sorted_idxs):
    chunks = torch.split(input, split_sizes.tolist(), dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


def solution(
    hidden_states,
    expert_mask,
    num_experts,
    input_splits,
    output_splits,
    num_global_tokens_per_local_expert,
    group=None,
):
    ep_size = dist.get_world_size(group)
    hidden_states = hidden_states.view(-1, hidden_states.shape[-1])
    hidden_shape = hidden_states.shape
    routing_map = expert_mask.sum(dim=1)
    num_tokens = hidden_states.shape[0]
    token_indices = torch.arange(num_tokens, device=hidden_states.device).unsqueeze(0).expand(num_experts, -1)
    sorted_indices = token_indices.masked_select(routing_map.bool())
    permuted = hidden_states.index_select(0, sorted_indices)
    received = permuted.new_empty((sum(output_splits), permuted.shape[1]))
    dist.all_to_all_single(received, permuted, output_splits, input_splits, group=group)
    num_local_experts = num_experts // ep_size
    sort_input_by_local_experts = torch.arange(num_experts).reshape(-1, num_local_experts).T.ravel().tolist()
    received = sort_chunks_by_idxs(
        received, num_global_tokens_per_local_expert.ravel(), sort_input_by_local_experts
    )
    return received, routing_map, sorted_indices, hidden_shape
