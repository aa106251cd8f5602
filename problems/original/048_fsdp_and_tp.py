"""The original benchmark's problem 48, exactly: a SwiGLU MLP sharded two ways, FSDP and TP.

The original factors W = n_tp * n_fsdp with the least n_tp >= 2 that leaves n_fsdp >= 2 (W = 4:
2 x 2, W = 8: 2 x 4), else n_tp = 1 (W = 2: 1 x 2, and every prime W). Rank r has TP index
t = r % n_tp and FSDP index f = r // n_tp; the TP groups are {f n_tp .. f n_tp + n_tp - 1}, the
FSDP groups {t, t + n_tp, ...}. As the original's input builder makes them (random normal bf16,
drawn once for all ranks), with D = 256 (rounded up to a multiple of lcm(n_tp, n_fsdp)), D_ff = 1024
and a batch of 2048 rows: rank r holds x_local [2048 / n_fsdp, D], rows f of the batch (the same on
the ranks of a TP group), and of W1, W2 [D, D_ff] and W3 [D_ff, D] the blocks W1_shard, W2_shard
[D / n_fsdp, D_ff / n_tp] (row block f, column block t) and W3_shard [D_ff / n_tp, D / n_fsdp]
(row block t, column block f). It is called as solution(x_local, W1_shard, W2_shard, W3_shard,
n_tp, n_fsdp). Each rank all-gathers its TP column block of W1 and W2 (stacking row blocks) and its
row block of W3 (side by side) over its FSDP group, computes (silu(x W1_t) * (x W2_t)) W3_t in bf16
and all-reduces it over its TP group: every rank returns y bf16 [2048 / n_fsdp, D]. Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds
(pkb's, docs/variants.md).

The original creates its six process groups on every call; ours, once per process (the first call,
which is judged, pays for them). With unit-variance weights the outputs are of order 10^4, so the
tolerance is about one bf16 unit of the largest; an element near zero is judged at atol = 0.01
against sums of that size, which only the same order of bf16 operations meets.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 48
NAME = "fsdp_and_tp"
CATEGORY = "FSDP+TP"
SOURCE = "PyTorch FSDP2 + tensor parallelism (2-D mesh), SwiGLU MLP"
SUMMARY = "SwiGLU MLP (D 256, D_ff 1024) with weights sharded over FSDP x TP; bf16 [2048 / n_fsdp, D]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (n_tp x n_fsdp as the original factors it)"
SIZES = {"pkb": {"m": 1024, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

_GROUPS = {}  # (n_tp, n_fsdp) -> this rank's (TP group, FSDP group)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _factor(world_size):
    """(n_tp, n_fsdp): the least n_tp >= 2 leaving n_fsdp >= 2, else (1, W)."""
    for n_tp in range(2, world_size):
        if world_size % n_tp == 0 and world_size // n_tp >= 2:
            return n_tp, world_size // n_tp
    return 1, world_size


def _dims(ctx):
    m, n = ctx.size["m"], ctx.size["n"]
    n_tp, n_fsdp = _factor(ctx.world_size)
    d = max(32, min(n, 256))
    d = -(-d // math.lcm(n_tp, n_fsdp)) * math.lcm(n_tp, n_fsdp)
    d_ff = -(-max(64, m) // n_tp) * n_tp
    batch = -(-max(2 * m, 2 * ctx.world_size) // n_fsdp) * n_fsdp
    return n_tp, n_fsdp, d, d_ff, batch


def make_inputs(ctx):
    """The original's: one batch and three weights shared by all ranks, each rank's blocks of them."""
    n_tp, n_fsdp, d, d_ff, batch = _dims(ctx)
    t, f = ctx.rank % n_tp, ctx.rank // n_tp
    rows, dr, dc = batch // n_fsdp, d // n_fsdp, d_ff // n_tp
    x = ctx.randn(batch, d, shared=True)[f * rows : (f + 1) * rows].clone()
    w1 = ctx.randn(d, d_ff, shared=True)[f * dr : (f + 1) * dr, t * dc : (t + 1) * dc].clone()
    w2 = ctx.randn(d, d_ff, shared=True)[f * dr : (f + 1) * dr, t * dc : (t + 1) * dc].clone()
    w3 = ctx.randn(d_ff, d, shared=True)[t * dc : (t + 1) * dc, f * dr : (f + 1) * dr].clone()
    return x, w1, w2, w3, n_tp, n_fsdp


def _groups(n_tp, n_fsdp):
    """This rank's (TP group, FSDP group), created on the first call and cached (every rank creates
    every group, in the same order)."""
    if (n_tp, n_fsdp) not in _GROUPS:
        rank = dist.get_rank()
        tp_group = fsdp_group = None
        for f in range(n_fsdp):
            g = dist.new_group([f * n_tp + t for t in range(n_tp)])
            if rank // n_tp == f:
                tp_group = g
        for t in range(n_tp):
            g = dist.new_group([f * n_tp + t for f in range(n_fsdp)])
            if rank % n_tp == t:
                fsdp_group = g
        _GROUPS[(n_tp, n_fsdp)] = (tp_group, fsdp_group)
    return _GROUPS[(n_tp, n_fsdp)]


def _gather_rows(shard, group, parts):
    out = shard.new_empty(parts * shard.shape[0], *shard.shape[1:])
    _all_gather(out, shard.contiguous(), group=group)
    return out


@torch.no_grad()
def solution(x_local, W1_shard, W2_shard, W3_shard, n_tp, n_fsdp):
    tp_group, fsdp_group = _groups(n_tp, n_fsdp)
    w1 = _gather_rows(W1_shard, fsdp_group, n_fsdp)
    w2 = _gather_rows(W2_shard, fsdp_group, n_fsdp)
    # W3's blocks lie side by side: gather them stacked, then lay them out along the columns
    w3 = _gather_rows(W3_shard, fsdp_group, n_fsdp).view(n_fsdp, *W3_shard.shape)
    w3 = w3.permute(1, 0, 2).reshape(W3_shard.shape[0], n_fsdp * W3_shard.shape[1])
    y = (F.silu(x_local @ w1) * (x_local @ w2)) @ w3
    if n_tp > 1:
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=tp_group)
    return y


def traffic(ctx):
    """Per GPU, the reference's schedule (its weight blocks are smaller than the activations): the
    other FSDP ranks' blocks of the three TP-local weights, and an all-reduce of y over the TP group
    (2 (n_tp - 1) / n_tp of it). Memory: x, the gathered weights and y. FLOPs: the three GEMMs of
    the TP block."""
    n_tp, n_fsdp, d, d_ff, batch = _dims(ctx)
    isz = ctx.dtype.itemsize
    rows, block = batch // n_fsdp, d * d_ff // (n_tp * n_fsdp)
    return {
        "nvlink_bytes": ((n_fsdp - 1) * 3 * block + 2 * (n_tp - 1) / n_tp * rows * d) * isz,
        "hbm_bytes": (2 * rows * d + 3 * n_fsdp * block) * isz,
        "flops": 6 * rows * d * d_ff // n_tp,
        "rounds": 2 if n_tp > 1 else 1,
    }
