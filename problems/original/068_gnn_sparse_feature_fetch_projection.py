"""The original benchmark's problem 68, exactly: fetch feature rows from a row-sharded table, project.

As the original's input builder makes them (a seed per rank): num_total_nodes = 111M rounded up to
a multiple of W, rank r's local_embedding_shard [111M / W, 256] bf16 standard normal (56.8 GB / W),
proj_matrix [256, 256] bf16 standard normal (its own on each rank), and input_node_ids [20000]:
query i asks rank o = (i + r) % W for its row (7 i + r) % S (S = 111M / W), id o S + that row, the
same in every trial. Called as solution(shard, ids, proj, num_total_nodes, None); it returns
table[ids] @ proj, [20000, 256] bf16 (values of magnitude ~16). Judged as the original harness
judges: atol = rtol = 1e-2, no norm bound.

Memory: the inputs are LEAN_INPUTS (never copied; a benchmark replays one input set), since a
rank's shard is 28 GB at W = 2. On a CPU device (the tests' machine) the table has cpu_total_nodes
rows in all instead of 111M, with the same layout and ids pattern.

The `pkb` variant keeps this exchange with random ids, a scaled projection and 13.875M rows a rank.
"""

import math

import torch
import torch.distributed as dist

ID = 68
NAME = "gnn_sparse_feature_fetch_projection"
CATEGORY = "GNN"
SOURCE = "GNN feature fetch at ogbn-papers100M scale"
SUMMARY = "Fetch 20000 patterned rows from a 111M x 256 bf16 table sharded by rows, project (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
# base_rows, base_cols: the original's M and N; cpu_total_nodes: the table's rows on a CPU device
SIZES = {"pkb": {"base_rows": 1024, "base_cols": 1024, "total_nodes": 111_000_000, "cpu_total_nodes": 131072}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
LEAN_INPUTS = True  # a rank's shard is 56.8 GB / W


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _shape(ctx):
    """(num_total_nodes, embed_dim, queries), as the original's input builder computes them."""
    s, w = ctx.size, ctx.world_size
    base = s["cpu_total_nodes"] if ctx.device.type == "cpu" else s["total_nodes"]
    total = -(-max(base, s["base_rows"]) // w) * w
    dim = 256 if s["base_cols"] >= 256 else 128
    return total, dim, max(20000, min(s["base_rows"] // w, 200000))


def make_inputs(ctx):
    """The original's: standard normal shard and projection, its fixed ids pattern."""
    w, r = ctx.world_size, ctx.rank
    total, dim, queries = _shape(ctx)
    rows = total // w
    shard = ctx.randn(rows, dim)
    proj = ctx.randn(dim, dim)
    i = torch.arange(queries, dtype=torch.int64, device=ctx.device)
    ids = ((i + r) % w) * rows + (i * 7 + r) % rows
    return shard, ids, proj, total, None


@torch.no_grad()
def solution(local_embedding_shard, input_node_ids, proj_matrix, num_total_nodes, group=None):
    w, r = dist.get_world_size(group), dist.get_rank(group)
    shard_size = -(-num_total_nodes // w)
    owner = (input_node_ids // shard_size).clamp(max=w - 1)
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=w)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    asked = input_node_ids.new_empty(sum(recvs))
    dist.all_to_all_single(asked, input_node_ids[order], recvs, sends, group=group)
    rows = local_embedding_shard.index_select(0, asked - r * shard_size)
    fetched = rows.new_empty(input_node_ids.numel(), rows.shape[1])
    dist.all_to_all_single(fetched, rows, sends, recvs, group=group)
    emb = torch.empty_like(fetched)
    emb[order] = fetched
    return emb @ proj_matrix


def traffic(ctx):
    """Per GPU: Q (W - 1) / W ids (exactly: the pattern sends Q / W to every owner) go to their
    owners at 4 bytes each and come back as rows. HBM: the ids, the fetched rows read, the
    projection, the output written; FLOPs: the projection."""
    w = ctx.world_size
    _, dim, queries = _shape(ctx)
    row = dim * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * queries * (4 + row),
        "hbm_bytes": queries * (8 + 2 * row) + dim * row,
        "flops": 2 * queries * dim * dim,
        "rounds": 2,
    }
