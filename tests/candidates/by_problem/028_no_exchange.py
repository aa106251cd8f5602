"""Problem 28 without the exchange: this rank's own permuted rows, cycled to the output's length. It
must fail (wrong, not crashed): the hidden states are random per rank."""

import torch


def solution(
    hidden_states,
    expert_mask,
    num_experts,
    input_splits,
    output_splits,
    num_global_tokens_per_local_expert,
    group=None,
):
    routing_map = expert_mask.sum(dim=1)
    tokens = torch.arange(hidden_states.shape[0]).expand(num_experts, -1)
    mapping = tokens.masked_select(routing_map.bool())
    permuted = hidden_states.index_select(0, mapping)
    rows = sum(output_splits)
    index = torch.arange(rows) % permuted.shape[0]
    return permuted[index], routing_map, mapping, hidden_states.shape
