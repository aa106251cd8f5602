"""The original benchmark's problem 80, exactly: DINOv2's Sinkhorn-Knopp centering over ranks' rows.

As the original's input builder makes them (a seed per rank): rank r holds teacher_output [1024,
16384] float32, standard normal times 0.01, and n_masked_patches_tensor = [1024] int64, and is
called as solution(teacher_output, 0.07, n_masked_patches_tensor, 3, None). Q = exp(scores / 0.07)
is divided by its total over every rank, then 3 times each prototype's column is normalised over
every rank's rows (divided by its all-reduced sum and by 16384) and each row by its own sum and the
all-reduced patch count N; every rank returns its rows times N, [1024, 16384] float32. Judged as the
original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds
(pkb's, docs/variants.md).

What a solution could skip: everything. Each returned row sums to 1 over 16384 prototypes, so every
output is about 6e-5, far inside atol = 1e-2: a zero tensor of the right shape passes (3 trials at
W = 2 on CPU). The `pkb` variant offsets each rank's prototypes so that the all-reduces matter.
"""

import math

import torch
import torch.distributed as dist

ID = 80
NAME = "dinov2_distributed_sinkhorn_knopp"
CATEGORY = "DP"
SOURCE = "DINOv2 Sinkhorn-Knopp teacher centering (iBOT patch loss)"
SUMMARY = "3 Sinkhorn-Knopp iterations on float32 scores [1024, 16384] x 0.01, rows split (the original's)."
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "every output is about 6e-5, far inside atol = 1e-2: a zero tensor of the right shape passes"
)
SIZES = {"pkb": {"rows": 1024, "prototypes": 16384, "scale": 0.01, "temp": 0.07, "iterations": 3}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: scores N(0, 0.01^2), temperature 0.07, this rank's patch count, 3 iterations."""
    s = ctx.size
    scores = ctx.randn(s["rows"], s["prototypes"], scale=s["scale"])
    count = torch.full((1,), s["rows"], dtype=torch.int64, device=ctx.device)
    return scores, s["temp"], count, s["iterations"], None


@torch.no_grad()
def solution(teacher_output, teacher_temp, n_masked_patches_tensor, n_iterations=3, group=None):
    q = teacher_output.float().div(teacher_temp).exp_()
    k = q.shape[1]
    totals = torch.stack([q.sum(), n_masked_patches_tensor.to(q.dtype).sum()])
    dist.all_reduce(totals, group=group)
    q.div_(totals[0])
    n_total = totals[1]
    for _ in range(n_iterations):
        per_prototype = q.sum(dim=0)
        dist.all_reduce(per_prototype, group=group)
        q.div_(per_prototype.mul_(k))
        q.div_(q.sum(dim=1, keepdim=True).mul_(n_total))
    return q.mul_(n_total)


def traffic(ctx):
    """Per GPU, as for pkb's variant (problems/080): the iterations' dependent all-reduces of K
    float32 prototype sums (Q's total and N cancel in exact arithmetic); the scores read once per
    iteration and once more, the result written."""
    w, s = ctx.world_size, ctx.size
    rows, k, n_it = s["rows"], s["prototypes"], s["iterations"]
    return {
        "nvlink_bytes": 2 * (w - 1) / w * k * 4 * n_it,
        "hbm_bytes": (n_it + 2) * rows * k * 4,
        "flops": 4 * (n_it + 1) * rows * k,
        "rounds": n_it,
    }
