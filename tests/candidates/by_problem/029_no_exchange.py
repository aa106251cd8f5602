"""Problem 29 without the exchange: this rank's own expert outputs, cycled to the rows it would get
back, weighted and summed per token. It must fail (wrong, not crashed): the expert outputs are random
per rank."""

import torch


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
    rows = expert_outputs[torch.arange(sum(input_splits)) % expert_outputs.shape[0]]
    probs = torch.zeros(routing_weights.shape[0], num_experts, dtype=routing_weights.dtype)
    probs.scatter_(1, selected_experts, routing_weights)
    weights = probs.T.contiguous().masked_select(routing_map)
    out = torch.zeros(org_hidden_states_shape, dtype=rows.dtype)
    return out.index_add_(0, local_input_permutation_mapping, rows * weights.unsqueeze(-1))
