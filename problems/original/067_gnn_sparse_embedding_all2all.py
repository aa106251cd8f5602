"""The original benchmark's problem 67, exactly: route (index, row) pairs to the rank owning index % W.

As the original's input builder makes them (a seed per rank): num_nodes = 100000 rounded up to a
multiple of W, and on every rank idx [1024] int64 uniform in [0, num_nodes) and value [1024, 128]
bf16 standard normal; called as solution(idx, value, num_nodes, None). It sends each pair to rank
idx % W and returns (recv_idx [n] int64, recv_value [n, 128] bf16): the pairs from rank 0 first,
each rank's in their order in its idx; n is about 1024 and differs by rank. Judged as the original
harness judges: atol = rtol = 1e-2, no norm bound (indices exactly, pkb's `exact` protection); the
inputs are drawn from secret seeds (pkb's, docs/variants.md).

The `pkb` variant keeps this workload but draws each rank's share per destination at random, so
that the splits are uneven.
"""

import math

import torch
import torch.distributed as dist

ID = 67
NAME = "gnn_sparse_embedding_all2all"
CATEGORY = "GNN"
SOURCE = "sparse embedding-gradient routing (GNN / recsys)"
SUMMARY = "Route 1024 uniform (index, bf16 row [128]) pairs to the rank owning index % W (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
# base_rows, base_cols: the original's M and N, from which it makes its sizes
SIZES = {"pkb": {"base_rows": 1024, "base_cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _shape(size, world_size):
    """(num_nodes, pairs a rank, hidden), as the original's input builder computes them."""
    m, w = size["base_rows"], world_size
    nodes = -(-max(100000, m) // w) * w
    return nodes, max(1024, min(m // w, 50000)), max(8, min(size["base_cols"], 128))


def make_inputs(ctx):
    """The original's: uniform indices, standard normal rows."""
    nodes, nnz, hidden = _shape(ctx.size, ctx.world_size)
    return ctx.randint(0, nodes, nnz), ctx.randn(nnz, hidden), nodes, None


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
    """Per GPU, in expectation: (W - 1) / W of the pairs leave once, each a row and a 4-byte index
    (the owner knows v % W); as many arrive. HBM: read idx and every row, write as many back."""
    w = ctx.world_size
    _, nnz, hidden = _shape(ctx.size, w)
    row = hidden * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (w - 1) / w * nnz * (row + 4),
        "hbm_bytes": 2 * nnz * (row + 8),
        "flops": 0,
        "rounds": 2,
    }
