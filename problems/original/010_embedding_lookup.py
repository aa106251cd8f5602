"""The original benchmark's problem 10, exactly: a row-wise sharded embedding lookup by all-to-all.

As the original's input builder makes them (a seed per rank): rank r holds rows r 1024 .. (r+1) 1024
- 1 of a table, local_shard [1024, 1024] bf16 (standard normal), and 1024 indices drawn uniformly
from the whole table's W 1024 rows. Called as solution(indices, local_shard). Each rank sends its
indices to the ranks that own them, looks up what it receives and sends the rows back: rank r
returns [1024, 1024], the rows of its indices grouped by the rank that owns them (owner 0's first,
each group in the indices' order), as the original's reference orders them. Judged as the original
harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).
"""

import math

import torch
import torch.distributed as dist

ID = 10
NAME = "embedding_lookup"
CATEGORY = "recsys"
SOURCE = "DLRM / TorchRec row-wise sharded embedding table"
SUMMARY = "Look up 1024 indices in a bf16 table whose 1024-row shards are spread over ranks; all-to-alls."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"shard_rows": 1024, "dim": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: indices into the whole table, and this rank's shard, standard normal."""
    s = ctx.size
    indices = ctx.randint(0, ctx.world_size * s["shard_rows"], s["shard_rows"])
    return indices, ctx.randn(s["shard_rows"], s["dim"])


def solution(indices, local_shard):
    rank, w = dist.get_rank(), dist.get_world_size()
    rows = local_shard.shape[0]
    owner = indices // rows
    order = torch.argsort(owner, stable=True)  # grouped by owner, each group in the indices' order
    send_counts = torch.bincount(owner, minlength=w)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    asked = indices.new_empty(sum(recvs))
    dist.all_to_all_single(asked, indices[order].contiguous(), recvs, sends)
    found = local_shard[(asked - rank * rows).clamp(0, rows - 1)]
    out = local_shard.new_empty((indices.numel(), local_shard.shape[1]))
    dist.all_to_all_single(out, found, sends, recvs)
    return out


def traffic(ctx):
    """Per GPU, in expectation: the (W-1)/W of its indices other ranks own go out (8 bytes each) and
    their rows come back; as many of others' requests are answered."""
    s, w, isz = ctx.size, ctx.world_size, ctx.dtype.itemsize
    remote = (w - 1) / w * s["shard_rows"]
    return {
        "nvlink_bytes": remote * (8 + s["dim"] * isz),
        "hbm_bytes": 2 * s["shard_rows"] * s["dim"] * isz,
        "flops": 0,
        "rounds": 2,
    }
