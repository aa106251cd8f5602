"""Cooperative feature fetching for GNN mini-batches: an all-to-all of feature rows, then a gather.

In GraphBolt's cooperative mini-batching every rank samples its own seeds, but a node's features
live on the rank that owns the node. Each rank has deduplicated its seeds and sent their ids to
their owners (already done, not part of the call); the owners have looked the rows up. So each rank
now holds local_features [sum(counts_received), F] in bf16: the rows the other ranks asked it for,
counts_received[j] rows for rank j, rank after rank. It must send each rank its rows, receive from
rank j the counts_sent[j] rows it asked rank j for (concatenated in rank order they form the
features of its sum(counts_sent) unique seeds), and return them expanded to its mini-batch:
out = received[seed_inverse_ids], [len(seed_inverse_ids), F] in bf16. counts_sent on rank r equals
counts_received[r] on rank j for every pair (the lists are plain Python ints, as the original passes
them). Pure data movement: judged bit for bit.

The request counts differ by pair and by trial (each rank asks itself for 1/W of its unique seeds
and splits the rest unevenly over the others) and every unique seed is used at least once.

Source: GraphBolt (DGL) cooperative feature exchange (ParallelKernelBench problem 65). The call is the
original's: (local_features, seed_inverse_ids, counts_sent, counts_received, None), and so are the
pkb shapes (768 unique seeds, 1024 ids, 128 features); the exchange is not (below).

Differences from the original: the call and the sizes (768 unique rows, 1024 ids, 128 features) are
the original's; the exchange is not. The original expands on the sender: it gathers
local_features[seed_inverse_ids] (its ids index its own rows), sends chunk i of those
(counts_received[i] rows) to rank (r + i) % W and fills chunk j of its output (counts_sent[j] rows)
from rank (r + j) % W, returning the received rows as they came (equal counts of 1024 / W, ids with
repeats). Here local_features holds the rows the peers asked for (counts_received[j] for rank j),
they are exchanged with rank j in rank order, and the receiver expands them: out =
received[seed_inverse_ids], with uneven random counts. So the original's own reference fails here
(its gathered rows do not split by counts that sum to 768: it raises).
"""

import torch
import torch.distributed as dist

ID = 65
NAME = "gnn_feature_exchange_all2all"
CATEGORY = "GNN"
SOURCE = "GraphBolt (DGL) cooperative mini-batching"
SUMMARY = "All-to-all of bf16 feature rows by per-rank counts, then expand to the mini-batch by inverse ids."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # unique: rows this rank receives (and sends); ids: its mini-batch; features: row width
    "pkb": {"unique": 768, "ids": 1024, "features": 128},
    # estimate, not yet measured: 0.54 GB of rows per rank, half of it over NVLink at W = 2
    # (~0.7 ms), then a gather writing 0.8 GB (~0.3 ms)
    "large": {"unique": 262144, "ids": 393216, "features": 1024},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["unique"] < 2 * world_size:
        return (
            f"unique = {size['unique']} leaves a rank fewer than 2 rows per peer at world size {world_size}"
        )
    return None


def request_counts(ctx, unique):
    """Rows rank i asks rank j for: c[(j - i) % W], the same list c on every rank (shared draws).

    A circulant matrix: every rank asks for `unique` rows and is asked for `unique` rows. c[0] (what a
    rank asks itself) is unique // W; the rest is split over the W - 1 peers in random proportions
    (weights uniform in [0.5, 1.5)). On the meta device the split is even (only shapes matter).
    """
    w = ctx.world_size
    own = unique // w
    rest = unique - own
    if ctx.is_meta:
        weights = torch.ones(w - 1)
    else:
        weights = ctx.rand(w - 1, low=0.5, high=1.5, dtype=torch.float64, shared=True).cpu()
    parts = (weights / weights.sum() * rest).floor().long().clamp_min(1)
    parts[0] += rest - int(parts.sum())
    return [own, *parts.tolist()]


def make_inputs(ctx):
    """Random rows; counts from request_counts; inverse ids covering every unique seed at least once."""
    s = ctx.size
    w, r = ctx.world_size, ctx.rank
    c = request_counts(ctx, s["unique"])
    counts_sent = [c[(j - r) % w] for j in range(w)]
    counts_received = [c[(r - i) % w] for i in range(w)]
    local_features = ctx.randn(sum(counts_received), s["features"])
    every = ctx.rand(s["unique"], dtype=torch.float32).argsort()
    extra = ctx.randint(0, s["unique"], s["ids"] - s["unique"])
    order = ctx.rand(s["ids"], dtype=torch.float32).argsort()
    seed_inverse_ids = torch.cat([every, extra])[order]
    return local_features, seed_inverse_ids, counts_sent, counts_received, None


def solution(local_features, seed_inverse_ids, counts_sent, counts_received, group=None):
    received = local_features.new_empty(sum(counts_sent), local_features.shape[1])
    dist.all_to_all_single(
        received,
        local_features,
        output_split_sizes=counts_sent,
        input_split_sizes=counts_received,
        group=group,
    )
    return received.index_select(0, seed_inverse_ids)


def traffic(ctx):
    """Per GPU: every row a peer asked for leaves once, unique - unique // W rows; as many arrive.

    No schedule moves less: each requested row exists only on its owner. HBM: read the local rows
    and the ids, write the expanded output (rows can be stored straight into their output slots as
    they arrive, so the unexpanded rows need not be written).
    """
    s = ctx.size
    w = ctx.world_size
    row = s["features"] * ctx.dtype.itemsize
    remote = s["unique"] - s["unique"] // w
    return {
        "nvlink_bytes": remote * row,
        "hbm_bytes": s["unique"] * row + s["ids"] * 8 + s["ids"] * row,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(local_features, seed_inverse_ids, counts_sent, counts_received, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call and the sizes (768 unique rows, 1024 ids, 128 features) are the original's; the "
        "exchange is not. The original expands on the sender: it gathers "
        "local_features[seed_inverse_ids] (its ids index its own rows), sends chunk i of those "
        "(counts_received[i] rows) to rank (r + i) % W and fills chunk j of its output "
        "(counts_sent[j] rows) from rank (r + j) % W, returning the received rows as they came (equal"
        " counts of 1024 / W, ids with repeats). Here local_features holds the rows the peers asked "
        "for (counts_received[j] for rank j), they are exchanged with rank j in rank order, and the "
        "receiver expands them: out = received[seed_inverse_ids], with uneven random counts. So the "
        "original's own reference fails here (its gathered rows do not split by counts that sum to "
        "768: it raises)."
    ),
}
