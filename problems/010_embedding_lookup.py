"""Lookup in a row-sharded embedding table: route ids to their owners, gather, route rows back.

The embedding tables of recommendation models (DLRM, TorchRec's row-wise sharding) are too large
for one GPU, so the table's rows are split across ranks: the table has V = W * rows_local rows of
width dim, and rank r owns rows r*rows_local .. (r+1)*rows_local - 1 as table_local
[rows_local, dim] in bf16. Each rank also holds a batch of its own lookup ids, ids [n_ids] int64,
uniform in [0, V) (duplicates allowed, any owner). Every rank must return the embedding rows of its
own ids in the order of its ids: out[i] = table[ids[i]], bf16 [n_ids, dim].

The reference follows the usual recipe: sort the ids by owner, exchange per-owner counts
(all-to-all), send the ids to their owners (all-to-all with those split sizes), gather the
requested rows from the local shard, send the rows back (all-to-all) and undo the sort. It is pure
data movement, so the answer must be bit-exact.

Source: row-wise sharded embedding lookup, DLRM / TorchRec style (ParallelKernelBench problem 10).
The ids are random, different per rank and per trial, and the table is random, so neither the
routing nor the rows can be known without communicating.
"""

import torch
import torch.distributed as dist

ID = 10
NAME = "embedding_lookup"
CATEGORY = "recsys"
SOURCE = "DLRM / TorchRec row-wise sharded embedding table"
SUMMARY = "ids [n_ids] into a table whose rows are sharded over ranks: return table[ids], [n_ids, dim]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # n_ids: lookups per rank; rows_local: table rows owned by each rank; dim: embedding width
    "pkb": {"n_ids": 1024, "rows_local": 1024, "dim": 1024},
    "large": {"n_ids": 131072, "rows_local": 131072, "dim": 2048},
}
# Pure data movement: every row must arrive bit-exact.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any number of ids and
    of table rows per rank (batches and vocabularies have any size), a width in multiples of 16."""
    return {
        "n_ids": draw("n_ids", 128, 1536),
        "rows_local": draw("rows_local", 128, 1536),
        "dim": draw("dim", 64, 1536, 16),
    }


def make_inputs(ctx):
    """This rank's ids, uniform over all W * rows_local rows, and its random table shard."""
    n_ids, rows_local, dim = ctx.size["n_ids"], ctx.size["rows_local"], ctx.size["dim"]
    ids = ctx.randint(0, ctx.world_size * rows_local, n_ids)
    table_local = ctx.randn(rows_local, dim)
    return ids, table_local


def solution(ids, table_local):
    w = dist.get_world_size()
    rows_local, dim = table_local.shape
    owner = torch.div(ids, rows_local, rounding_mode="floor")
    order = torch.argsort(owner, stable=True)
    send_ids = ids[order]
    send_counts = torch.bincount(owner, minlength=w)

    # 1. how many ids go to each owner, and how many each peer will ask of us
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_split = send_counts.tolist()
    recv_split = recv_counts.tolist()

    # 2. the ids themselves, grouped by owner
    recv_ids = ids.new_empty(sum(recv_split))
    dist.all_to_all_single(recv_ids, send_ids, recv_split, send_split)

    # 3. the requested rows go back the way the ids came
    rows = table_local[recv_ids - dist.get_rank() * rows_local]
    got = table_local.new_empty(ids.numel(), dim)
    dist.all_to_all_single(got, rows, send_split, recv_split)

    out = torch.empty_like(got)
    out[order] = got
    return out


def traffic(ctx):
    """Per GPU: the rows its ids need from other ranks, (W-1)/W of its output on average.

    With one-sided reads of the peers' table shards over NVLink, the ids never have to travel: a
    rank reads each foreign row it needs straight from its owner, in one step. With uniform ids,
    the rows a GPU serves to its peers balance the rows it fetches.
    """
    w = ctx.world_size
    n_ids, dim = ctx.size["n_ids"], ctx.size["dim"]
    row_bytes = dim * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * n_ids * row_bytes,
        # read the ids, read the rows served from the local shard, write the output
        "hbm_bytes": n_ids * 8 + 2 * n_ids * row_bytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(indices: torch.Tensor, local_shard: torch.Tensor) -> torch.Tensor",
    "args": lambda inputs, env: inputs,
}
