"""Sparse embedding-gradient routing: send each (index, row) pair to the rank that owns the index.

Each rank holds idx [nnz] int64 (node ids in [0, num_nodes)) and value [nnz, hidden] bf16, the rows
of a sparse gradient. Node v belongs to rank v % W. Every rank sends each pair to its owner and
returns what it receives: (recv_idx [n] int64, recv_value [n, hidden] bf16), the pairs from rank 0
first, then rank 1's, and so on, each rank's pairs in their order in its idx (a stable sort by
owner). n, the number of pairs this rank owns, differs by rank and trial. Pure data movement:
judged bit for bit.

Inputs are random per rank and trial: each rank's share of pairs per destination is random (weights
uniform in [0.25, 1.75)), so the splits are uneven; the index within the owner's nodes is uniform
(repeats allowed, as in a gradient); the rows are standard normal. A rank that skips the exchange
returns its own pairs (the wrong ones and the wrong number).

Source: sparse embedding-gradient routing in GNN and recommender training (ParallelKernelBench
problem 67). The call (idx, value, num_nodes, group), the owner rule v % W, the output order and the
pkb sizes (1024 pairs of 128 bf16 values a rank, num_nodes = 100000 rounded up to a multiple of W)
are the original's.

Differences from the original: the original draws idx uniformly, so every rank sends about nnz / W
pairs to every rank; here each rank's share per destination is random, so the splits differ by rank
and destination (and the output sizes by rank) by up to a factor of 7.
"""

import torch
import torch.distributed as dist

ID = 67
NAME = "gnn_sparse_embedding_all2all"
CATEGORY = "GNN"
SOURCE = "sparse embedding-gradient routing (GNN / recsys)"
SUMMARY = "Route (index, bf16 row) pairs to the rank owning index % W; uneven variable splits."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"base_nodes": 100000, "nnz": 1024, "hidden": 128},
    # estimate, not yet measured: 4M rows of 256 B (1 GB) a rank, 3/4 of it across NVLink at W = 4
    # (a floor of 2.1 ms at 395 GB/s)
    "large": {"base_nodes": 1 << 24, "nnz": 1 << 22, "hidden": 128},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any node and pair
    counts, rows in multiples of 16 (bf16 rows of 32-byte multiples)."""
    return {
        "base_nodes": draw("base_nodes", 10000, 200000),
        "nnz": draw("nnz", 256, 2048),
        "hidden": draw("hidden", 32, 256, 16),
    }


def num_nodes(size, world_size):
    """The original's: base_nodes rounded up to a multiple of W."""
    return -(-size["base_nodes"] // world_size) * world_size


def make_inputs(ctx):
    """Owners drawn with random per-destination weights, then a uniform node of that owner."""
    s, w = ctx.size, ctx.world_size
    n = num_nodes(s, w)
    value = ctx.randn(s["nnz"], s["hidden"])
    if ctx.is_meta:
        return ctx.randint(0, n, s["nnz"]), value, n, None
    weights = ctx.rand(w, low=0.25, high=1.75, dtype=torch.float64)
    cdf = weights.cumsum(0) / weights.sum()
    owner = torch.searchsorted(cdf, ctx.rand(s["nnz"], dtype=torch.float64), right=True).clamp(max=w - 1)
    idx = owner + w * ctx.randint(0, n // w, s["nnz"])
    return idx, value, n, None


@torch.no_grad()
def solution(idx, value, num_nodes, group=None):
    w = dist.get_world_size(group)
    owner = idx % w
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=w)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    recv_idx = idx.new_empty(sum(recvs))
    dist.all_to_all_single(recv_idx, idx[order], recvs, sends, group=group)
    recv_value = value.new_empty(sum(recvs), *value.shape[1:])
    dist.all_to_all_single(recv_value, value[order], recvs, sends, group=group)
    return recv_idx, recv_value


def traffic(ctx):
    """Per GPU, in expectation: the pairs owned elsewhere, (W - 1) / W of them on average over
    ranks, leave once, each a row and its index (4 bytes: the owner knows v % W, so v // W < 2^31
    suffices); as many arrive. No schedule moves less: the rows are random and exist only on their
    sender. HBM: read idx and every row, write as many received rows and indices."""
    s, w = ctx.size, ctx.world_size
    row = s["hidden"] * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * s["nnz"] * (row + 4),
        "hbm_bytes": 2 * s["nnz"] * (row + 8),
        "flops": 0,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(idx: torch.Tensor, value: torch.Tensor, num_nodes: int, group: "
    "Optional[dist.ProcessGroup] = None) -> Tuple[torch.Tensor, torch.Tensor]",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call, the owner rule idx % W, the output order and the sizes are the original's; the "
        "indices are not: the original draws them uniformly (about nnz / W pairs to every rank), "
        "here each rank's share per destination is random, so the splits are uneven."
    ),
}
