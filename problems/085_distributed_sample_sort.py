"""Distributed sort: every rank's bf16 values sorted globally, then split evenly over the ranks.

Rank r holds local_shard [n_r] bf16, unsorted, with n_r = n + r, except that every rank r with
r % 4 == 1 holds none (n_r = 0: an empty shard, as the original's odd ranks have on one trial in
four; at W = 2 that is rank 1 on every trial, so there the workload is rank 0's local sort and a send
of the upper half of it to rank 1, and the all-to-all exchange starts at W = 4). Let T = n_0 + ... +
n_{W-1} and the global sequence be every rank's values in ascending order.
Rank d returns its slice of that sequence, bf16 [T // W + (1 if d < T % W else 0)]: ranks below
T % W hold one value more, rank 0's slice first. Equal values are indistinguishable, so the answer
is unique; pure data movement, judged exactly.

Inputs: rank r's values are uniform in a band of its own, [-(r + 1) + 0.1, -r - 0.1] before the
rounding to bf16 (which keeps them inside the band for W <= 16), so the bands run in the reverse of
rank order: the global sequence is rank W-1's values first, then rank W-2's, and a rank's output is
mostly other ranks' values. A band holds from 32 (|value| near 8) to a few thousand bf16 values per
unit, so at the `large` size every value repeats many times, which a sort must handle.

The reference is a sample sort with tensor ops only: it sorts its shard, all-gathers the counts and
W regular samples of every non-empty shard, picks W - 1 splitters, sends each bucket to its rank with
one variable all-to-all (its counts first), sorts what it received, and moves the sorted buckets to
the even slices with a second variable all-to-all whose splits follow from the all-gathered bucket
sizes. A solution may instead find exact splitters (a few rounds of counting) and move each value
once.

Source: parallel sample sort (ParallelKernelBench problem 85, a generic sort). The call is the
original's: (local_shard, None).

Differences from the original: the call and the output (sorted, split T // W with the remainder on
the first ranks) are the original's. The original's shards hold max(4 W, 1024 / W) values (128 at
W = 8: the pkb size), integers from -50 .. 49 minus r times the shard size, rounded to bf16 after the
subtraction, with the odd ranks empty on one trial in four; here rank r holds n + r values from its
own band, uniform, and ranks r % 4 == 1 are always empty, so that the shard sizes, and the traffic
model, are known without the trial. The original's reference finds its splitters and split points
in Python loops over the ranks; this one uses tensor ops (its split sizes still cross to the host,
as torch.distributed's variable all-to-all takes them as lists).
"""

import torch
import torch.distributed as dist

ID = 85
NAME = "distributed_sample_sort"
CATEGORY = "generic"
SOURCE = "parallel sample sort"
SUMMARY = "Sort bf16 values held unevenly by the ranks (some empty) and split the result evenly."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # n: rank r holds n + r values (none where r % 4 == 1)
    "pkb": {"n": 128},
    # estimate, not yet measured: 32 MiB of values per rank, about all of which must move (0.085 ms
    # at 395 GB/s); the reference's two sorts of 16 M keys and two all-to-alls take well over 1 ms
    "large": {"n": 16 * 1024 * 1024},
}
# A permutation of the inputs: bit-exact.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}
BAND_MARGIN = 0.1


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any shard length (a
    sort's input has no alignment)."""
    return {"n": draw("n", 16, 512)}


def shard_size(rank, size):
    """n_r: n + r, none on ranks r % 4 == 1."""
    return 0 if rank % 4 == 1 else size["n"] + rank


def target_range(rank, world_size, total):
    """The half-open positions [start, end) of the global sequence that `rank` returns."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def make_inputs(ctx):
    """n_r values uniform in rank r's band [-(r + 1) + 0.1, -r - 0.1], bf16; group None."""
    n = shard_size(ctx.rank, ctx.size)
    low = -(ctx.rank + 1) + BAND_MARGIN
    return ctx.rand(n, low=low, high=-ctx.rank - BAND_MARGIN), None


def _variable_all_to_all(values, send_counts, group):
    """Send values[splits] to each rank by send_counts (int64 [W]); returns what every rank sent here."""
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    return _all_to_all_by_counts(values, send_counts.tolist(), recv_counts.tolist(), group)


def _all_to_all_by_counts(values, send, recv, group):
    out = values.new_empty(sum(recv))
    dist.all_to_all_single(out, values, output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


@torch.no_grad()
def solution(local_shard, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    dev = local_shard.device
    ranks = torch.arange(w, device=dev)
    local = local_shard.sort().values
    n = local.numel()

    counts = torch.empty(w, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(counts, torch.tensor([n], device=dev), group=group)
    # W regular samples of each shard (empty shards send +inf, which sorts after every real one)
    samples = local[(ranks + 1) * n // (w + 1)] if n > 0 else local.new_full((w,), float("inf"))
    gathered = samples.new_empty(w * w)
    dist.all_gather_into_tensor(gathered, samples, group=group)
    real = int((counts > 0).sum()) * w
    splitters = gathered.sort().values[(ranks[1:] * real) // w]

    # bucket b: the values v with splitters[b-1] < v <= splitters[b]
    ends = torch.searchsorted(local, splitters, right=True)
    bounds = torch.cat([ends.new_zeros(1), ends, ends.new_full((1,), n)])
    bucket = _variable_all_to_all(local, bounds.diff(), group).sort().values

    # the sorted buckets, in rank order, are the global sequence: send each part to its owner
    sizes = torch.empty(w, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(sizes, torch.tensor([bucket.numel()], device=dev), group=group)
    bucket_ends = sizes.cumsum(0)
    bucket_starts = bucket_ends - sizes
    total = int(bucket_ends[-1])
    base, extra = divmod(total, w)
    target_starts = ranks * base + ranks.clamp(max=extra)
    target_ends = target_starts + base + (ranks < extra).long()

    def overlap(starts, ends, start, end):
        return (torch.minimum(ends, end) - torch.maximum(starts, start)).clamp(min=0)

    send = overlap(target_starts, target_ends, bucket_starts[rank], bucket_ends[rank])
    recv = overlap(bucket_starts, bucket_ends, target_starts[rank], target_ends[rank])
    return _all_to_all_by_counts(bucket, send.tolist(), recv.tolist(), group)


def _moved_values(world_size, size):
    """Per rank: (values it must send, values it must receive) when each value moves once."""
    n = [shard_size(r, size) for r in range(world_size)]
    total = sum(n)
    moved = []
    for r in range(world_size):
        # rank r's values occupy the positions after those of every higher rank (the bands reverse)
        first = sum(n[r + 1 :])
        start, end = target_range(r, world_size, total)
        kept = max(0, min(end, first + n[r]) - max(start, first))
        moved.append((n[r] - kept, end - start - kept))
    return moved


def traffic(ctx):
    """Per GPU: the values that must leave it or reach it when each value moves once (exact splitters).

    The bands fix each value's place in the global sequence up to equal values, so each rank keeps only
    the part of its shard that falls into its own slice; the figure is the largest send or receive over
    the ranks. The reference moves values twice (to buckets, then to the even slices). The counts and
    the splitters are a few bytes per rank, left out; they take a round before the values, so 2 rounds.
    HBM: read the shard, write the output (a sort of it in registers and shared memory is the least).
    """
    w, s = ctx.world_size, ctx.size
    moved = _moved_values(w, s)
    most = max(max(pair) for pair in moved)
    largest = max(shard_size(r, s) for r in range(w))
    total = sum(shard_size(r, s) for r in range(w))
    return {
        "nvlink_bytes": most * ctx.dtype.itemsize,
        "hbm_bytes": (largest + -(-total // w)) * ctx.dtype.itemsize,
        "flops": 0,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(local_shard: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call and the output are the original's. The original's shards hold max(4 W, 1024 / W) "
        "integers from -50 .. 49 minus r times the shard size, rounded to bf16, with the odd ranks empty "
        "on one trial in four; here rank r holds n + r values (n = 128, the original's at W = 8) uniform "
        "in a band of its own, the bands in the reverse of rank order, and ranks r % 4 == 1 are always "
        "empty. The original's reference finds its splitters and split points in Python loops; this "
        "one uses tensor ops."
    ),
}
