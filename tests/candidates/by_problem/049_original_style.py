"""Problem 49 in the original benchmark's convention, the way VeOmni's all-to-all dispatcher goes:
route with a bf16 softmax and top-k, one-hot routing map [E, T], all-gather the per-expert counts and
read the splits on the host, permute the tokens by expert, all-to-all them, sort the received chunks
by local expert, run the MLP, sort back, all-to-all back, and scale and scatter-add the outputs in
bf16. Called as solution(hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj,
num_experts, top_k, None). It sums in bf16 where the reference sums in float32, within the
tolerance, so it passes unchanged."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    group = group or dist.group.WORLD
    ep_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    num_local_experts = num_experts // ep_size
    hidden = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden)
    num_tokens = x.shape[0]
    probs, selected = torch.topk(torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1), top_k, dim=-1)
    routing_map = F.one_hot(selected, num_experts).sum(dim=1).T.bool()  # [E, T]
    tokens_per_expert = routing_map.sum(dim=1)
    gathered = [torch.empty_like(tokens_per_expert) for _ in range(ep_size)]
    dist.all_gather(gathered, tokens_per_expert, group=group)
    start = rank * num_local_experts
    per_local_expert = torch.stack(gathered)[:, start : start + num_local_experts]  # [source, local]
    input_splits = tokens_per_expert.view(ep_size, num_local_experts).sum(dim=1).tolist()
    output_splits = per_local_expert.sum(dim=1).tolist()

    token_indices = (
        torch.arange(num_tokens, device=x.device).expand(num_experts, -1).masked_select(routing_map)
    )
    permuted = x.index_select(0, token_indices)
    received = x.new_empty(sum(output_splits), hidden)
    dist.all_to_all_single(received, permuted, output_splits, input_splits, group=group)
    chunks = received.split(per_local_expert.reshape(-1).tolist())
    by_expert = torch.cat(
        [chunks[p * num_local_experts + e] for e in range(num_local_experts) for p in range(ep_size)]
    )

    expert_out = down_proj(F.silu(gate_proj(by_expert)) * up_proj(by_expert))

    chunks = expert_out.split(per_local_expert.T.reshape(-1).tolist())
    by_source = torch.cat([chunks[e * ep_size + p] for p in range(ep_size) for e in range(num_local_experts)])
    returned = x.new_empty(sum(input_splits), hidden)
    dist.all_to_all_single(returned, by_source, input_splits, output_splits, group=group)
    weights_idx = torch.zeros(num_tokens, num_experts, dtype=probs.dtype, device=x.device)
    weights_idx.scatter_add_(1, selected, probs)
    token_weights = weights_idx.T.contiguous().masked_select(routing_map)
    out = torch.zeros(num_tokens, hidden, dtype=x.dtype, device=x.device)
    out.scatter_add_(0, token_indices.unsqueeze(1).expand(-1, hidden), returned * token_weights.unsqueeze(1))
    return out
