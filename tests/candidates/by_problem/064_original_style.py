"""Problem 64 the way PyG's distributed sampler loop reads: per hop, group the frontier by owner,
send the ids, walk each asked node's CSC range in Python, send back the sampled sources, edge ids
and per-node counts, put each node's answer back in frontier order, and keep the first appearance
of every new node (numpy's unique). Called as the original harness calls it: (seed_nodes, fanouts,
local_adj_row_ptr, local_adj_col, node_to_rank, None, False)."""

import numpy as np
import torch
import torch.distributed as dist


def _variable_all_to_all(send: torch.Tensor, send_splits: list[int], group):
    """all_to_all_single of a 1-D tensor whose per-rank sizes only the sender knows; the tensor
    received and its per-rank sizes."""
    sizes = torch.tensor(send_splits, dtype=torch.long)
    recv_sizes = torch.empty_like(sizes)
    dist.all_to_all_single(recv_sizes, sizes, group=group)
    recv_splits = recv_sizes.tolist()
    out = send.new_empty(sum(recv_splits))
    dist.all_to_all_single(out, send, recv_splits, send_splits, group=group)
    return out, recv_splits


@torch.no_grad()
def solution(
    seed_nodes: torch.Tensor,
    fanouts: list[int],
    local_adj_row_ptr: torch.Tensor,
    local_adj_col: torch.Tensor,
    node_to_rank: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    replace: bool = False,
):
    group = group or dist.group.WORLD
    world = dist.get_world_size(group)
    frontier = seed_nodes.long().clone()
    all_nodes = frontier.clone()
    hop_sources, hop_targets, hop_edges = [], [], []
    for fanout in fanouts:
        if frontier.numel() == 0:
            break
        owners = node_to_rank[frontier]
        by_rank = [torch.nonzero(owners == r).flatten() for r in range(world)]
        asked, asked_splits = _variable_all_to_all(
            torch.cat([frontier[p] for p in by_rank]), [p.numel() for p in by_rank], group
        )
        # answer every asked node from the local CSC, one node at a time
        answer_nodes, answer_edges, answer_counts = [], [], []
        for i in range(asked.numel()):
            v = int(asked[i].item())
            lo, hi = int(local_adj_row_ptr[v].item()), int(local_adj_row_ptr[v + 1].item())
            k = hi - lo if fanout < 0 else min(int(fanout), hi - lo)
            answer_nodes.append(local_adj_col[lo : lo + k])
            answer_edges.append(torch.arange(lo, lo + k))
            answer_counts.append(k)
        counts = torch.tensor(answer_counts, dtype=torch.long)
        node_splits, offset = [], 0
        for n in asked_splits:
            node_splits.append(sum(answer_counts[offset : offset + n]))
            offset += n
        flat_nodes = torch.cat(answer_nodes) if answer_nodes else torch.zeros(0, dtype=torch.long)
        flat_edges = torch.cat(answer_edges) if answer_edges else torch.zeros(0, dtype=torch.long)
        got_nodes, _ = _variable_all_to_all(flat_nodes, node_splits, group)
        got_edges, _ = _variable_all_to_all(flat_edges, node_splits, group)
        got_counts, _ = _variable_all_to_all(counts, asked_splits, group)
        # got_* follow the order the frontier was sent in (rank by rank); put it back in frontier order
        node_parts = list(torch.split(got_nodes, got_counts.tolist()))
        edge_parts = list(torch.split(got_edges, got_counts.tolist()))
        sent_order = torch.cat(by_rank).tolist()
        slot = {position: j for j, position in enumerate(sent_order)}
        new_sources, new_targets, new_edges = [], [], []
        for position in range(frontier.numel()):
            j = slot[position]
            new_sources.append(node_parts[j])
            new_edges.append(edge_parts[j])
            new_targets.append(frontier[position].repeat(node_parts[j].numel()))
        sampled = torch.cat(new_sources)
        if sampled.numel() == 0:
            break
        hop_sources.append(sampled)
        hop_targets.append(torch.cat(new_targets))
        hop_edges.append(torch.cat(new_edges))
        # first appearances, in order, of the nodes not seen before
        combined = torch.cat([all_nodes, sampled])
        _, first = np.unique(combined.numpy(), return_index=True)
        first.sort()
        before = all_nodes.numel()
        all_nodes = combined[torch.from_numpy(first)]
        frontier = all_nodes[before:]
    index_of = {int(v): i for i, v in enumerate(all_nodes.tolist())}
    sources = torch.cat(hop_sources) if hop_sources else torch.zeros(0, dtype=torch.long)
    targets = torch.cat(hop_targets) if hop_targets else torch.zeros(0, dtype=torch.long)
    row = torch.tensor([index_of[int(v)] for v in sources.tolist()], dtype=torch.long)
    col = torch.tensor([index_of[int(v)] for v in targets.tolist()], dtype=torch.long)
    edges = torch.cat(hop_edges) if hop_edges else torch.zeros(0, dtype=torch.long)
    return all_nodes, row, col, edges
