"""Backward of cooperative feature fetching (problem 65): sum gradients per unique seed, send them home.

Problem 65's forward received, from each rank j, the counts_sent[j] feature rows this rank asked j
for (its seed_size = sum(counts_sent) unique seeds, in rank order) and expanded them to the
mini-batch with seed_inverse_ids. Its backward takes the mini-batch's gradient,
grad_output [len(seed_inverse_ids), F] in float32, and must

  1. sum the gradient rows of each unique seed: grad_seed[u] = sum of grad_output[i] over
     seed_inverse_ids[i] == u, [seed_size, F] (a seed the mini-batch never used gets zeros);
  2. send the counts_sent[j] rows of rank j's seeds back to rank j, and receive from each rank j the
     counts_received[j] rows of the features this rank had sent it,

returning the gradient of its local features, [sum(counts_received), F] in float32, rows in rank
order. counts_sent on rank r equals counts_received[r] on rank j (Python ints, as the original
passes them). The request counts differ by pair and by trial; every unique seed is used at least
once and many of them several times.

Source: GraphBolt (DGL) cooperative mini-batching, backward of the feature exchange (ParallelKernelBench
problem 66). The call is the original's: (grad_output, seed_inverse_ids, seed_size, counts_sent,
counts_received, None), and so are the pkb shapes (1024 ids, 512 unique seeds, 128 features).

Differences from the original: the call and the sizes (1024 ids, 512 unique seeds, 128 features) are
the original's; the order of the sum and the exchange is not. The original exchanges first and sums
after: it sends chunk i of grad_output (counts_sent[i] rows) to rank (r + i) % W, fills chunk j of
what it receives (counts_received[j] rows) from rank (r + j) % W, and returns the received rows
summed by seed_inverse_ids into [seed_size, F] (a sparse.mm), with equal counts of 1024 / W. Here a
rank sums its own gradient rows by seed_inverse_ids first and exchanges the sums with each rank j in
rank order, with uneven random counts. So the original's own reference fails here (its gradient does
not split by counts that sum to 512: it raises). The gradients are float32 whatever dtype is
requested, as in the original, and DTYPE says so; the inputs and counts are random and differ per
trial.
"""

import torch
import torch.distributed as dist

ID = 66
NAME = "gnn_feature_exchange_all2all_backward"
CATEGORY = "GNN"
SOURCE = "GraphBolt (DGL) cooperative mini-batching"
SUMMARY = "Sum float32 gradient rows per unique seed, then all-to-all them back to the rows' owners."
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # seed_size: unique seeds of this rank (= rows it receives back); ids: its mini-batch; features
    "pkb": {"seed_size": 512, "ids": 1024, "features": 128},
    # estimate, not yet measured: a 0.8 GB gradient summed into 0.5 GB (~0.4 ms of HBM), half of
    # the sums over NVLink at W = 2 (~0.7 ms)
    "large": {"seed_size": 131072, "ids": 196608, "features": 1024},
}
# Each sum has 1 to a few float32 terms; correct solutions differ only in their order (atomic
# adds on a GPU run in any order): a unit or two in the last place of float32. Measured on CPU at
# W = 4 against float64 sums rounded once: relative norm 2.8e-8, at most 9.5e-7 (one unit at |x| ~ 4).
# A bf16 round trip of the gradient is off by ~2e-3 and fails.
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5, "rel_norm": 1e-6}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["seed_size"] < 2 * world_size:
        return f"seed_size = {size['seed_size']} leaves fewer than 2 rows per peer at world size {world_size}"
    return None


def request_counts(ctx, unique):
    """Rows rank i asked rank j for: c[(j - i) % W], the same list c on every rank (shared draws).

    A circulant matrix: every rank asked for `unique` rows and was asked for `unique` rows. c[0] (what a
    rank asked itself) is unique // W; the rest is split over the W - 1 peers in random proportions
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
    """Random float32 gradients; counts from request_counts; ids covering every unique seed."""
    s = ctx.size
    w, r = ctx.world_size, ctx.rank
    c = request_counts(ctx, s["seed_size"])
    counts_sent = [c[(j - r) % w] for j in range(w)]
    counts_received = [c[(r - i) % w] for i in range(w)]
    grad_output = ctx.randn(s["ids"], s["features"], dtype=torch.float32)
    every = ctx.rand(s["seed_size"], dtype=torch.float32).argsort()
    extra = ctx.randint(0, s["seed_size"], s["ids"] - s["seed_size"])
    order = ctx.rand(s["ids"], dtype=torch.float32).argsort()
    seed_inverse_ids = torch.cat([every, extra])[order]
    return grad_output, seed_inverse_ids, s["seed_size"], counts_sent, counts_received, None


def solution(grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received, group=None):
    features = grad_output.shape[1]
    grad_seed = grad_output.new_zeros(seed_size, features).index_add_(0, seed_inverse_ids, grad_output)
    out = grad_output.new_empty(sum(counts_received), features)
    dist.all_to_all_single(
        out,
        grad_seed,
        output_split_sizes=counts_received,
        input_split_sizes=counts_sent,
        group=group,
    )
    return out


def traffic(ctx):
    """Per GPU: the summed rows of the peers' seeds leave once, seed_size - seed_size // W of them.

    Summing before sending is the least: sending unsummed rows (ids - seed_size more) moves more.
    HBM: read the gradient and the ids, write the output; the per-seed sums of the peers' rows
    need not be stored here, they can be added into the owner's output as they are made.
    """
    s = ctx.size
    w = ctx.world_size
    row = s["features"] * 4
    remote = s["seed_size"] - s["seed_size"] // w
    return {
        "nvlink_bytes": remote * row,
        "hbm_bytes": s["ids"] * row + s["ids"] * 8 + s["seed_size"] * row,
        "flops": (s["ids"] - s["seed_size"]) * s["features"],
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(grad_output, seed_inverse_ids, seed_size, counts_sent, counts_received, group=None)"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call and the sizes (1024 ids, 512 unique seeds, 128 features) are the original's; the "
        "order of the sum and the exchange is not. The original exchanges first and sums after: it "
        "sends chunk i of grad_output (counts_sent[i] rows) to rank (r + i) % W, fills chunk j of "
        "what it receives (counts_received[j] rows) from rank (r + j) % W, and returns the received "
        "rows summed by seed_inverse_ids into [seed_size, F] (a sparse.mm), with equal counts of 1024"
        " / W. Here a rank sums its own gradient rows by seed_inverse_ids first and exchanges the "
        "sums with each rank j in rank order, with uneven random counts. So the original's own "
        "reference fails here (its gradient does not split by counts that sum to 512: it raises). The"
        " gradients are float32 whatever dtype is requested, as in the original, and DTYPE says so; "
        "the inputs and counts are random and differ per trial."
    ),
}
