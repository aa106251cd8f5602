"""The original benchmark's problem 21, exactly: VeOmni's FSDP2 gradient clipping without expert parallelism.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds a list
of three gradient shards, each [1024, 1024], and is called as solution(grads, 1.0, 2.0, WORLD). Each
rank sums the squares of its shards in float32 (torch.norm of each, raised to the power 2),
all-reduces that sum over the FSDP group (the world), and takes the square root: the total 2-norm, a
0-dim float32 tensor, which every rank returns. Where it exceeds max_norm it scales every shard in
place by max_norm / norm, as the original does. Judged with the original harness's bounds,
atol = rtol = 1e-2, no norm bound, on the returned norm and on the shards after the call; the inputs
are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: the clipping. The original harness compares the returned norm only;
this variant also judges the shards after the call (the workload updates them in place,
`MUTATES_INPUTS`, and the harness judges every tensor the inputs hold, inside lists too), so a
solution that leaves the gradients unclipped fails here where the original passed it. With
max_norm = 1 and a norm of about 1800 sqrt(W) the clipped values are about 5e-4, below the atol:
the shards catch a clipping skipped, not a wrong clip coefficient. The all-reduce cannot be
skipped: a rank's own norm is 1 / sqrt(W) of the total.
"""

import math

import torch
import torch.distributed as dist

ID = 21
NAME = "clip_grad_norm_no_ep"
CATEGORY = "DP/FSDP"
SOURCE = "VeOmni FSDP2 clip_grad_norm (no expert parallelism)"
SUMMARY = "Global 2-norm of 3 bf16 [1024, 1024] FSDP shards per rank, clipped in place to 1 (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024, "shards": 3}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
# the workload clips its gradients in place: not a change the mutation check may fail
MUTATES_INPUTS = True


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: three standard normal shards, max_norm 1, the 2-norm, the world as FSDP group."""
    s = ctx.size
    grads = [ctx.randn(s["rows"], s["cols"]) for _ in range(s["shards"])]
    # shapes only (the meta device, on the host): no process group exists there
    world = "WORLD" if ctx.is_meta else dist.group.WORLD
    return grads, 1.0, 2.0, world


def solution(grad_tensors, max_norm, norm_type=2.0, fsdp_group=None):
    p = float(norm_type)
    grads = [g for g in grad_tensors if g is not None]
    total = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    for g in grads:
        total = total + torch.linalg.vector_norm(g.detach(), ord=p, dtype=torch.float32) ** p
    if fsdp_group is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=fsdp_group)
    total_norm = total ** (1.0 / p)
    if total_norm > max_norm:
        coef = max_norm / total_norm
        for g in grads:
            g.mul_(coef)
    return total_norm


def traffic(ctx):
    """Per GPU: one float32 sum of squares sent to every peer (a one-shot all-reduce); the shards
    read for the norm, then read and written once more to clip them in place."""
    s, w = ctx.size, ctx.world_size
    elems = s["shards"] * s["rows"] * s["cols"]
    return {
        "nvlink_bytes": (w - 1) * 4,
        "hbm_bytes": 3 * elems * ctx.dtype.itemsize,
        "flops": 3 * elems,
        "rounds": 1,
    }
