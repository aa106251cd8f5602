"""The original benchmark's problem 41, exactly: a ZeRO-1 step (Adam's moments sharded).

As the original's input builder makes them (one seed for all ranks, so every rank draws the same
batch): a batch X [n, 256], targets y [n, 256] (n = 1024 rounded up to a multiple of W), rank r
holding rows r n / W .. (r + 1) n / W of each; the MLP's weights W1 [h, 256], b1 [h], W2 [256, h],
b2 [256], standard normal on rank 0 and zeros elsewhere, where h is 512, or the least above it that
makes the parameter count P a multiple of W; this rank's part of Adam's moments, zeros [P / W]; lr
1e-3, betas (0.9, 0.999), eps 1e-8 and the step, all bf16 but the constants. Called as solution(X,
y, W1, b1, W2, b2, m_part, v_part, lr, beta1, beta2, eps, step). Each rank broadcasts rank 0's
parameters (flattened, in that order), computes the MSE loss of relu(X W1^T + b1) W2^T + b2 against
y and its gradients, all-reduces the gradients in bf16, divides them by W and keeps its part, takes
one Adam step with bias correction on its part r P / W .. (r + 1) P / W of the parameters, and all-
gathers the updated parts. Every rank returns (W1, b1, W2, b2, m_part, v_part): the updated
parameters, the same everywhere, and its own updated moments. Judged as the original harness judges:
atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).
The original's step is 1 + trial % 7; here it is drawn from 1 .. 7 by each trial's secret seed (the
same on every rank).

What a solution could skip: the parameter update and its all-gather, which the tolerance cannot see:
with zero moments the update is at most lr = 1e-3 per element, below the atol of 1e-2, so a file
that returns the broadcast parameters unchanged passes (3 trials at W = 2, on CPU). The broadcast
and the gradient all-reduce cannot be skipped: the moments carry the averaged gradient.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 41
NAME = "zero1_optimizer_shard"
CATEGORY = "DP/ZeRO"
SOURCE = "DeepSpeed ZeRO stage 1"
SUMMARY = (
    "ZeRO-1 step of a bf16 MLP 256-512-256: grads all-reduced, Adam on 1/W, params all-gathered (original's)."
)
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 prime to 3 and 19 (the parameter count 513 h + 256 must divide by it)"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if _dims(size, world_size) is None:
        return f"no hidden size from 512 up makes the parameter count divisible by {world_size}"
    return None


def _numel(d_in, hidden, d_out):
    return hidden * d_in + hidden + d_out * hidden + d_out


def _dims(size, world_size):
    """The original's batch rows (a multiple of W), d_in, hidden and d_out from its base shape;
    hidden grows from 512 until the parameter count divides by W; None where it never does."""
    rows, cols = size["rows"], size["cols"]
    n = -(-max(rows, world_size) // world_size) * world_size
    d_in, d_out = max(16, min(cols, 256)), max(8, min(cols // 4, 256))
    first = max(32, min(cols // 2, 512))
    for hidden in range(first, first + 1024):  # as many tries as the original's builder makes
        if _numel(d_in, hidden, d_out) % world_size == 0:
            return n, d_in, hidden, d_out
    return None


def make_inputs(ctx):
    """The original's: a batch shared by all ranks, split by rows; weights standard normal on rank 0
    and zeros elsewhere; this rank's zero moments; Adam's constants and a step in 1 .. 7."""
    w, rank = ctx.world_size, ctx.rank
    n, d_in, hidden, d_out = _dims(ctx.size, w)
    rows = slice(rank * n // w, (rank + 1) * n // w)
    x = ctx.randn(n, d_in, shared=True)[rows].contiguous()
    y = ctx.randn(n, d_out, shared=True)[rows].contiguous()
    step = 1 if ctx.is_meta else 1 + int(ctx.randint(0, 7, 1, shared=True))
    shapes = [(hidden, d_in), (hidden,), (d_out, hidden), (d_out,)]
    params = [ctx.randn(*s, shared=True) if rank == 0 else ctx.full(s, 0.0) for s in shapes]
    part = _numel(d_in, hidden, d_out) // w
    return (x, y, *params, ctx.full((part,), 0.0), ctx.full((part,), 0.0), LR, BETA1, BETA2, EPS, step)


def _loss_grads(x, y, params):
    leaves = [p.detach().requires_grad_(True) for p in params]
    w1, b1, w2, b2 = leaves
    out = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)
    return torch.autograd.grad(F.mse_loss(out, y), leaves)


def solution(X_local, y_local, W1, b1, W2, b2, exp_avg_part, exp_avg_sq_part, lr, beta1, beta2, eps, step):
    w, rank = dist.get_world_size(), dist.get_rank()
    shapes = [W1, b1, W2, b2]
    flat_p = torch.cat([t.reshape(-1) for t in shapes])
    dist.broadcast(flat_p, src=0)
    sizes = [t.numel() for t in shapes]
    params = [c.view_as(t) for c, t in zip(flat_p.split(sizes), shapes, strict=True)]
    part = exp_avg_part.numel()
    if part * w != flat_p.numel():
        raise ValueError("the moments' parts must cover the parameters")
    flat_g = torch.cat([g.reshape(-1) for g in _loss_grads(X_local, y_local, params)])
    dist.all_reduce(flat_g, op=dist.ReduceOp.SUM)
    flat_g.div_(w)
    g_part = flat_g[rank * part : (rank + 1) * part]
    if step < 1:
        raise ValueError("Adam's step starts at 1")
    bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
    m = exp_avg_part.clone().mul_(beta1).add_(g_part, alpha=1.0 - beta1)
    v = exp_avg_sq_part.clone().mul_(beta2).addcmul_(g_part, g_part, value=1.0 - beta2)
    w_part = flat_p[rank * part : (rank + 1) * part].clone()
    w_part.add_((m / bc1).div((v / bc2).sqrt().add(eps)).mul(-lr))
    updated = torch.empty_like(flat_p)
    _all_gather(updated, w_part)
    out = [c.view_as(t) for c, t in zip(updated.split(sizes), shapes, strict=True)]
    return (*out, m, v)


def traffic(ctx):
    """Per GPU: the parameters from rank 0 (each rank receives them once), 2 (W - 1) / W of the
    gradients each way (a ring all-reduce), then (W - 1) / W of the updated parameters (the all-
    gather). FLOPs: the MLP's forward and backward passes on this rank's rows, and Adam's few
    per element of its part. HBM: the rows read, the parameters read and written, the moments'
    part read and written."""
    w = ctx.world_size
    n, d_in, hidden, d_out = _dims(ctx.size, w)
    numel = _numel(d_in, hidden, d_out)
    rows = n // w
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (1 + 2 * (w - 1) / w + (w - 1) / w) * numel * isz,
        "hbm_bytes": (rows * (d_in + d_out) + 4 * numel + 4 * numel // w) * isz,
        "flops": 6 * rows * (d_in * hidden + hidden * d_out) + 10 * numel // w,
        "rounds": 4,
    }
