"""The original benchmark's problem 64, exactly: two-hop neighbour sampling with fanouts [10, 5].

As the original's input builder makes them, the same on every trial: N = 10000 rounded up to a
multiple of W nodes; every rank holds the whole graph, a ring: local_adj_row_ptr [N + 1] = 16 v,
local_adj_col [16 N] with node v's 16 edges from v + 1, ..., v + 16 (mod N); node_to_rank [N] = v %
W; rank r's seed_nodes [512] are r 512, ..., r 512 + 511 (mod N). It is called as
solution(seed_nodes, [10, 5], row_ptr, col, node_to_rank, None, False) and returns (node, row, col,
edge), int64: the seeds and the 15 nodes the two hops find ([527]), and for each of the 5170 sampled
edges the positions of its ends in `node` and its edge id ([5170] each). Judged as the original
harness judges (atol = rtol = 1e-2, no norm bound; integers exactly, pkb's `exact` protection).

What a solution could skip: every rank holds the whole graph, so it can sample every node itself
without any exchange, and the inputs are the same in every trial. The `pkb` variant partitions a
random graph so that each rank holds only its own nodes' edges.
"""

import math

import torch
import torch.distributed as dist

ID = 64
NAME = "gnn_neighbor_sampling"
CATEGORY = "GNN"
SOURCE = "PyG-style distributed neighbour sampler"
SUMMARY = (
    "Two-hop neighbour sampling (fanouts [10, 5]) of a 10000-node ring every rank holds (the original's)."
)
DTYPE = "int64"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "every rank holds the whole graph, and the inputs repeat every trial: each rank samples every node itself"
)
# base_nodes, base_seeds: the original's M and N, from which it makes its node and seed counts
SIZES = {"pkb": {"base_nodes": 1024, "base_seeds": 1024, "degree": 16, "fanouts": [10, 5]}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _shape(size, world_size):
    """(nodes, seeds a rank), as the original's input builder computes them."""
    nodes = max(10000, min(size["base_nodes"], 100000))
    nodes = -(-nodes // world_size) * world_size
    return nodes, max(512, min(size["base_seeds"] // world_size, 2048))


def make_inputs(ctx):
    """The original's ring, replicated on every rank, its partition v % W and consecutive seeds."""
    w, degree = ctx.world_size, ctx.size["degree"]
    nodes, seeds = _shape(ctx.size, w)
    v = torch.arange(nodes, dtype=torch.int64, device=ctx.device)
    row_ptr = torch.arange(nodes + 1, dtype=torch.int64, device=ctx.device) * degree
    col = ((v[:, None] + torch.arange(1, degree + 1, device=ctx.device)) % nodes).reshape(-1)
    seed_nodes = (torch.arange(seeds, dtype=torch.int64, device=ctx.device) + ctx.rank * seeds) % nodes
    return seed_nodes, list(ctx.size["fanouts"]), row_ptr, col, v % w, None, False


def _expand(starts, counts):
    """starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1, concatenated over i."""
    total = int(counts.sum())
    first = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(starts - first, counts, output_size=total) + torch.arange(
        total, device=counts.device
    )


def _segment_sums(values, lengths):
    """Sums of consecutive segments of `values`, of the given lengths (a list of ints)."""
    segment = torch.repeat_interleave(
        torch.arange(len(lengths), device=values.device), torch.tensor(lengths, device=values.device)
    )
    return values.new_zeros(len(lengths)).index_add_(0, segment, values)


def _sample_hop(src, fanout, row_ptr, col, node_to_rank, w, group):
    """One hop: ask the owners, sample there, answer; (neighbours, edge ids, counts) in src order."""
    owner = node_to_rank[src]
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=w)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    asked = src.new_empty(sum(recvs))
    dist.all_to_all_single(asked, src[order], recvs, sends, group=group)

    start = row_ptr[asked]
    take = row_ptr[asked + 1] - start
    if fanout >= 0:
        take = take.clamp(max=fanout)
    edge_ids = _expand(start, take)
    answer = torch.stack([col[edge_ids], edge_ids], 1)

    got = torch.empty_like(src)  # per request, in the order sent
    dist.all_to_all_single(got, take, sends, recvs, group=group)
    out_splits = _segment_sums(take, recvs).tolist()
    in_splits = _segment_sums(got, sends).tolist()
    replies = answer.new_empty(sum(in_splits), 2)
    dist.all_to_all_single(replies, answer, in_splits, out_splits, group=group)

    position = torch.empty_like(order)  # where src[i] was sent among the requests
    position[order] = torch.arange(order.numel(), device=order.device)
    counts = got[position]
    picked = replies[_expand((torch.cumsum(got, 0) - got)[position], counts)]
    return picked[:, 0], picked[:, 1], counts


@torch.no_grad()
def solution(seed_nodes, fanouts, local_adj_row_ptr, local_adj_col, node_to_rank, group=None, replace=False):
    w = dist.get_world_size(group)
    num_nodes = node_to_rank.numel()
    src = seed_nodes.to(torch.int64)
    seen = torch.zeros(num_nodes, dtype=torch.bool, device=src.device)
    seen[src] = True
    nodes, sources, targets, edges = [src.clone()], [], [], []
    for fanout in fanouts:
        nbr, eid, counts = _sample_hop(
            src, int(fanout), local_adj_row_ptr, local_adj_col, node_to_rank, w, group
        )
        sources.append(nbr)
        targets.append(src.repeat_interleave(counts))
        edges.append(eid)
        # the unseen sampled nodes, each at its first appearance, in order of appearance
        fresh = nbr[~seen[nbr]]
        uniq, inverse = torch.unique(fresh, return_inverse=True)
        first = torch.full_like(uniq, fresh.numel()).scatter_reduce_(
            0, inverse, torch.arange(fresh.numel(), device=fresh.device), "amin"
        )
        src = fresh[first.sort().values]
        seen[src] = True
        nodes.append(src)
    node = torch.cat(nodes)
    label = torch.full((num_nodes,), -1, dtype=torch.int64, device=node.device)
    label[node] = torch.arange(node.numel(), device=node.device)
    if not fanouts:
        return node, node.new_empty(0), node.new_empty(0), node.new_empty(0)
    return node, label[torch.cat(sources)], label[torch.cat(targets)], torch.cat(edges)


def traffic(ctx):
    """Per GPU: no NVLink bytes are needed, since every rank holds the whole graph and can sample
    its own frontier. HBM, for the ring's 512 + 15 nodes and 5170 edges: read each frontier node's
    range and each sampled source, write the outputs."""
    seeds = _shape(ctx.size, ctx.world_size)[1]
    frontier, edges, found = seeds + 10, seeds * 10 + 10 * 5, 15
    return {"nvlink_bytes": 0, "hbm_bytes": frontier * 16 + edges * 32 + (seeds + found) * 8, "flops": 0}
