"""Problem 32 in the original benchmark's convention, the way VeOmni's all-to-all dispatcher goes:
softmax top-k routing as a one-hot expert mask [E, k, T]; per-expert counts, all-gathered as a list;
split sizes read on the host; tokens permuted expert by expert with masked_select; the dispatch
all-to-all; the received chunks regrouped by local expert, the MLP with its LoRA terms added to
each projection (as PEFT's LoRA linear layer does, bf16 throughout), the chunks put back in source
order; the combine all-to-all; the router weights gathered by the same mask and the weighted copies
scatter-added in bf16. Called as solution(hidden_states, gate_weight, gate_bias, gate_proj, up_proj,
down_proj, lora_gate_A, lora_gate_B, lora_up_A, lora_up_B, lora_down_A, lora_down_B, num_experts,
top_k, None); it passes unchanged in both variants."""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _dispatch(group, x, output_splits, input_splits):
    out = torch.empty((sum(output_splits), x.shape[1]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


def _reorder(x, sizes, order):
    chunks = torch.split(x, sizes, dim=0)
    return torch.cat([chunks[i] for i in order], dim=0)


def _lora(base, x, a, b):
    return base(x) + F.linear(F.linear(x, a), b)


def solution(
    hidden_states,
    gate_weight,
    gate_bias,
    gate_proj,
    up_proj,
    down_proj,
    lora_gate_A,
    lora_gate_B,
    lora_up_A,
    lora_up_B,
    lora_down_A,
    lora_down_B,
    num_experts,
    top_k,
    group=None,
):
    group = group or dist.group.WORLD
    ep_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    n_local = num_experts // ep_size
    hidden = hidden_states.size(-1)
    h = hidden_states.reshape(-1, hidden)
    n_tokens = h.size(0)

    probs = torch.softmax(F.linear(h, gate_weight, gate_bias), dim=-1)
    routing_weights, selected = torch.topk(probs, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_classes=num_experts).permute(2, 1, 0)  # [E, k, T]

    tokens_per_expert = expert_mask.sum(dim=(1, 2))
    input_splits = tokens_per_expert.reshape(ep_size, n_local).sum(dim=1).tolist()
    gathered = [torch.empty_like(tokens_per_expert) for _ in range(ep_size)]
    dist.all_gather(gathered, tokens_per_expert, group=group)
    per_local_expert = torch.stack(gathered)[:, rank * n_local : (rank + 1) * n_local]  # [ep, n_local]
    output_splits = per_local_expert.sum(dim=1).tolist()
    chunk_sizes = per_local_expert.ravel().tolist()  # (source rank, local expert), source-major

    routing_map = expert_mask.sum(dim=1).bool()  # [E, T]
    token_ids = torch.arange(n_tokens, device=h.device).unsqueeze(0).expand(num_experts, -1)
    permutation = token_ids.masked_select(routing_map)
    received = _dispatch(group, h.index_select(0, permutation), output_splits, input_splits)

    expert_major = [p * n_local + e for e in range(n_local) for p in range(ep_size)]
    grouped = _reorder(received, chunk_sizes, expert_major)
    act = F.silu(_lora(gate_proj, grouped, lora_gate_A, lora_gate_B)) * _lora(
        up_proj, grouped, lora_up_A, lora_up_B
    )
    y = _lora(down_proj, act, lora_down_A, lora_down_B)
    source_major = [e * ep_size + p for p in range(ep_size) for e in range(n_local)]
    y = _reorder(y, [chunk_sizes[i] for i in expert_major], source_major)
    returned = _dispatch(group, y, input_splits, output_splits)

    dense = torch.zeros((n_tokens, num_experts), dtype=routing_weights.dtype, device=h.device)
    dense.scatter_add_(1, selected, routing_weights)
    pair_weights = dense.T.contiguous().masked_select(routing_map)
    weighted = returned * pair_weights.unsqueeze(-1)
    out = torch.zeros_like(h)
    out.scatter_add_(0, permutation.unsqueeze(1).expand(-1, hidden), weighted)
    return out.view_as(hidden_states)
