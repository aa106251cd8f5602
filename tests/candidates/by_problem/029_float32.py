"""Problem 29 with the weighted sum in float32: the rows regrouped and exchanged as the reference does,
each token's k rows weighted and added in float32 and rounded to bf16 once. A more precise correct
solution: it must pass (it measures the tolerance)."""

import torch
import torch.distributed as dist


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
    w, local = num_global_tokens_per_local_expert.shape
    chunks = torch.split(expert_outputs, num_global_tokens_per_local_expert.T.flatten().tolist())
    by_rank = torch.cat([chunks[e * w + p] for p in range(w) for e in range(local)])
    back = by_rank.new_empty(sum(input_splits), by_rank.shape[1])
    dist.all_to_all_single(back, by_rank, input_splits, output_splits)
    experts = torch.arange(num_experts).repeat_interleave(routing_map.sum(dim=1))
    tokens = local_input_permutation_mapping
    match = selected_experts[tokens] == experts[:, None]
    weights = (routing_weights[tokens].float() * match).sum(dim=1)
    out = torch.zeros(org_hidden_states_shape, dtype=torch.float32)
    out.index_add_(0, tokens, back.float() * weights[:, None])
    return out.to(expert_outputs.dtype)
