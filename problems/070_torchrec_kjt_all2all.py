"""TorchRec's KeyedJaggedTensor all-to-all: send each feature's jagged bags to the rank that owns it.

Every rank holds a KeyedJaggedTensor of F = sum(key_splits) features over its batch of B samples:
lengths [F B] int64 (feature-major: feature f's B bag lengths, then feature f + 1's) and values
[sum(lengths)] int64 (the ids of every bag, in the same order). Rank d owns key_splits[d] features,
the consecutive ones after those of ranks 0 .. d - 1. Every rank sends each feature's lengths and
values to its owner and returns a dict, the owned features over the global batch of W B samples:
- "lengths" [key_splits[r] W B] int64: for each owned feature, the B lengths from rank 0, then rank
  1's, ...; "values": the bags' ids in the same order (size data-dependent);
- "stride": W B and "stride_per_rank": [B] * W, int64 tensors (0-dim and [W]).
Pure data movement: judged exactly.

Inputs are random per rank and trial: bag lengths uniform in [0, max_length] (empty bags included),
ids uniform in [0, 10^6). A rank that skips the exchange returns its own bags for the wrong samples.

Source: TorchRec's KJTAllToAll (ParallelKernelBench problem 70). The call (lengths, values,
key_splits, batch_size, pg), key_splits = 1 + d % 3, the outputs and the pkb sizes (512 samples a
rank, lengths up to 20) are the original's. `weights` (per-id weights, moved like the ids) and
`stagger` (the order of the source ranks in each feature's output) are implemented as the original's;
a variable batch per feature (`stride_per_key`) is not part of this workload: the reference refuses it.

Differences from the original:
- Bag lengths are uniform in [0, 20] (the original's in [5, 20]): KJTs have empty bags, and a
  solution must keep them.
- The reference moves the lengths and ids with two all-to-alls after one all-to-all of the splits,
  and reorders them with tensor operations (the original loops over segments in Python, one
  .item() per segment bound), with the same results.
- The `large` size scales the number of features: key_splits = key_scale (1 + d % 3).
"""

import torch
import torch.distributed as dist

ID = 70
NAME = "torchrec_kjt_all2all"
CATEGORY = "recsys"
SOURCE = "TorchRec KJTAllToAll"
SUMMARY = "KeyedJaggedTensor all-to-all: each feature's jagged bags to its owner, reordered by feature."
DTYPE = "int64"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"key_scale": 1, "batch_size": 512, "max_length": 20},
    # estimate, not yet measured: 224 features at W = 4 (32, 64, 96, 32 a rank), 32768 samples a
    # rank, 10 ids a bag on average: 73M ids (590 MB) a rank; the rank owning 96 features receives
    # 288 features' bags (a floor of 1.0 ms at 395 GB/s as 4-byte ids, 2.3 ms at W = 8)
    "large": {"key_scale": 32, "batch_size": 32768, "max_length": 20},
}
# Pure data movement: every correct solution returns the same integers.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}
ID_RANGE = 1_000_000  # the original's ids: uniform in [0, 10^6)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): 2 or 3 times the
    original's features a rank, batches in multiples of 8 and any longest bag."""
    return {
        "key_scale": draw("key_scale", 1, 3),
        "batch_size": draw("batch_size", 64, 1024, 8),
        "max_length": draw("max_length", 4, 40),
    }


def key_splits(size, world_size):
    """Features owned by each rank: key_scale (1 + d % 3), the original's rule at key_scale 1."""
    return [size["key_scale"] * (1 + d % 3) for d in range(world_size)]


def make_inputs(ctx):
    """Random bag lengths and ids; the original's key splits and batch size."""
    s = ctx.size
    splits = key_splits(s, ctx.world_size)
    features, batch = sum(splits), s["batch_size"]
    lengths = ctx.randint(0, s["max_length"] + 1, features * batch)
    total = features * batch * s["max_length"] // 2 if ctx.is_meta else int(lengths.sum())
    return lengths, ctx.randint(0, ID_RANGE, total), splits, batch, None


def _expand(starts, counts):
    """starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1, concatenated over i."""
    total = int(counts.sum())
    first = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(starts - first, counts, output_size=total) + torch.arange(
        total, device=counts.device
    )


def _segment_sums(values, lengths):
    """Sums of consecutive segments of `values`, of the given lengths (a tensor)."""
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=values.device), lengths)
    return values.new_zeros(lengths.numel()).index_add_(0, segment, values)


@torch.no_grad()
def solution(
    lengths,
    values,
    key_splits,
    batch_size,
    pg=None,
    weights=None,
    stride_per_key=None,
    stagger=1,
):
    if stride_per_key is not None:
        raise ValueError("a variable batch per feature (stride_per_key) is not part of this workload")
    w, r = dist.get_world_size(pg), dist.get_rank(pg)
    device = lengths.device
    owner = torch.repeat_interleave(torch.arange(w, device=device), torch.tensor(key_splits, device=device))
    ids_per_rank = lengths.new_zeros(w).index_add_(0, owner, lengths.view(-1, batch_size).sum(1))
    meta = torch.stack([ids_per_rank, torch.full_like(ids_per_rank, batch_size)], 1)
    got = torch.empty_like(meta)
    dist.all_to_all_single(got, meta, group=pg)
    ids_from, batch_from = got[:, 0].tolist(), got[:, 1].tolist()

    local = key_splits[r]
    length_sends = [batch_size * k for k in key_splits]
    length_recvs = [b * local for b in batch_from]
    sends = [(lengths, length_sends, length_recvs), (values, ids_per_rank.tolist(), ids_from)]
    if weights is not None:
        sends.append((weights, ids_per_rank.tolist(), ids_from))
    received, works = [], []
    for tensor, out_splits, in_splits in sends:
        out = tensor.new_empty(sum(in_splits))
        works.append(dist.all_to_all_single(out, tensor, in_splits, out_splits, group=pg, async_op=True))
        received.append(out)
    for work in works:
        work.wait()

    # received: source-major segments (rank s, feature f) of batch_from[s] lengths; the output is
    # feature-major, the sources in `stagger` order
    group_size = w // stagger
    source_order = torch.tensor(
        [x + group_size * y for x in range(group_size) for y in range(stagger)], device=device
    )
    batches = torch.tensor(batch_from, device=device)
    segment_lengths = batches.repeat_interleave(local)  # (s, f) order
    segment_ids = _segment_sums(received[0], segment_lengths)
    order = (source_order[None, :] * local + torch.arange(local, device=device)[:, None]).reshape(-1)

    def regroup(data, sizes):
        starts = torch.cumsum(sizes, 0) - sizes
        return data[_expand(starts[order], sizes[order])]

    result = {
        "lengths": regroup(received[0], segment_lengths),
        "values": regroup(received[1], segment_ids),
        "stride": batches.sum(),
        "stride_per_rank": batches,
    }
    if weights is not None:
        result["weights"] = regroup(received[2], segment_ids)
    return result


def traffic(ctx):
    """Per GPU, in expectation, for the busiest rank: the lengths and ids of the features owned
    elsewhere leave once; a rank receives its features' bags from every other rank. At the fewest
    bytes (lengths < 256 and ids < 2^31 here) a length takes 1 byte and an id 4; a bag holds
    max_length / 2 ids on average. No schedule moves less: the bags are random and exist only on
    their sender. HBM: read and write every length and id once."""
    s, w = ctx.size, ctx.world_size
    splits = key_splits(s, w)
    features, batch = sum(splits), s["batch_size"]
    per_bag = 1 + 4 * s["max_length"] / 2
    sent = max((features - k) * batch * per_bag for k in splits)
    received = max((w - 1) * k * batch * per_bag for k in splits)
    return {
        "nvlink_bytes": max(sent, received),
        "hbm_bytes": 2 * features * batch * (8 + 8 * s["max_length"] / 2),
        "flops": 0,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(lengths: torch.Tensor, values: torch.Tensor, key_splits: List[int], "
    "batch_size: int, pg: Optional[dist.ProcessGroup] = None, weights: Optional[torch.Tensor] = "
    "None, stride_per_key: Optional[List[int]] = None, stagger: int = 1) -> Dict[str, torch.Tensor]",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call, key_splits = 1 + d % 3, the outputs and the sizes are the original's; bag "
        "lengths are uniform in [0, 20] (the original's in [5, 20]), so empty bags occur."
    ),
}
