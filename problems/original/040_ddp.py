"""The original benchmark's problem 40, exactly: one data-parallel training step of a two-layer MLP with Adam.

As the original's input builder makes them (one seed for all ranks, so every rank draws the same
batch): a batch X [n, 256], targets y [n, 256] (n = 1024 rounded up to a multiple of W), rank r
holding rows r n / W .. (r + 1) n / W of each; the MLP's weights W1 [512, 256], b1 [512], W2 [256,
512], b2 [256], standard normal on rank 0 and zeros elsewhere; Adam's moments, zeros on every rank;
lr 1e-3, betas (0.9, 0.999), eps 1e-8 and the step, all bf16 but the constants. Called as
solution(X, y, W1, b1, W2, b2, m_W1, m_b1, m_W2, m_b2, v_W1, v_b1, v_W2, v_b2, lr, beta1, beta2,
eps, step). Each rank broadcasts rank 0's parameters and moments, computes the MSE loss of
relu(X W1^T + b1) W2^T + b2 against y and its gradients, all-reduces the gradients in bf16 and
divides them by W, and takes one Adam step with bias correction; every rank returns the 12 updated
tensors (W1, b1, W2, b2, their first moments, their second moments), the same on every rank.
Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md). The original's step is 1 + trial % 7; here it is drawn from
1 .. 7 by each trial's secret seed (the same on every rank).

What a solution could skip: the broadcast of the moments, which are zeros on every rank, and the
parameter update, which the tolerance cannot see: with zero moments it is at most lr = 1e-3 per
element, below the atol of 1e-2. A file that returns the broadcast parameters unchanged and both
moments from the averaged gradient passes (3 trials at W = 2, on CPU). The broadcast of the
parameters and the gradient all-reduce cannot be skipped: the moments carry the averaged gradient.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 40
NAME = "ddp"
CATEGORY = "DP"
SOURCE = "PyTorch DistributedDataParallel + Adam"
SUMMARY = "One DDP step of a bf16 MLP 256-512-256 on 1024 rows, Adam from zero moments (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _dims(size, world_size):
    """The original's batch rows (a multiple of W), d_in, hidden and d_out from its base shape."""
    rows, cols = size["rows"], size["cols"]
    n = -(-max(rows, world_size) // world_size) * world_size
    return n, max(16, min(cols, 256)), max(32, min(cols // 2, 512)), max(8, min(cols // 4, 256))


def make_inputs(ctx):
    """The original's: a batch shared by all ranks, split by rows; weights standard normal on rank 0
    and zeros elsewhere; zero moments; Adam's constants and a step in 1 .. 7."""
    w, rank = ctx.world_size, ctx.rank
    n, d_in, hidden, d_out = _dims(ctx.size, w)
    rows = slice(rank * n // w, (rank + 1) * n // w)
    x = ctx.randn(n, d_in, shared=True)[rows].contiguous()
    y = ctx.randn(n, d_out, shared=True)[rows].contiguous()
    step = 1 if ctx.is_meta else 1 + int(ctx.randint(0, 7, 1, shared=True))
    shapes = [(hidden, d_in), (hidden,), (d_out, hidden), (d_out,)]
    params = [ctx.randn(*s, shared=True) if rank == 0 else ctx.full(s, 0.0) for s in shapes]
    moments = [ctx.full(s, 0.0) for s in shapes + shapes]
    return (x, y, *params, *moments, LR, BETA1, BETA2, EPS, step)


def _loss_grads(x, y, params):
    leaves = [p.detach().requires_grad_(True) for p in params]
    w1, b1, w2, b2 = leaves
    out = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)
    return torch.autograd.grad(F.mse_loss(out, y), leaves)


def _broadcast_from_0(tensors):
    """Copies of rank 0's tensors, sent as one flat buffer."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.broadcast(flat, src=0)
    return [c.view_as(t) for c, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]


def solution(
    X_local,
    y_local,
    W1,
    b1,
    W2,
    b2,
    exp_avg_W1,
    exp_avg_b1,
    exp_avg_W2,
    exp_avg_b2,
    exp_avg_sq_W1,
    exp_avg_sq_b1,
    exp_avg_sq_W2,
    exp_avg_sq_b2,
    lr,
    beta1,
    beta2,
    eps,
    step,
):
    w = dist.get_world_size()
    params = _broadcast_from_0([W1, b1, W2, b2])
    exp_avg = _broadcast_from_0([exp_avg_W1, exp_avg_b1, exp_avg_W2, exp_avg_b2])
    exp_avg_sq = _broadcast_from_0([exp_avg_sq_W1, exp_avg_sq_b1, exp_avg_sq_W2, exp_avg_sq_b2])
    grads = _loss_grads(X_local, y_local, params)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(w)
    grads = [c.view_as(g) for c, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)]
    if step < 1:
        raise ValueError("Adam's step starts at 1")
    bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq, strict=True):
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        p.add_((m / bc1).div((v / bc2).sqrt().add(eps)).mul(-lr))
    return (*params, *exp_avg, *exp_avg_sq)


def traffic(ctx):
    """Per GPU: the parameters and both moments from rank 0 (each rank receives them once), then a
    ring all-reduce of the gradients, 2 (W - 1) / W of them each way. FLOPs: the MLP's forward and
    backward passes on this rank's rows, and Adam's few per parameter. HBM: the rows read, the
    parameters and moments read and written."""
    w = ctx.world_size
    n, d_in, hidden, d_out = _dims(ctx.size, w)
    numel = hidden * d_in + hidden + d_out * hidden + d_out
    rows = n // w
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": (3 + 2 * (w - 1) / w) * numel * isz,
        "hbm_bytes": (rows * (d_in + d_out) + 6 * numel) * isz,
        "flops": 6 * rows * (d_in * hidden + hidden * d_out) + 10 * numel,
        "rounds": 3,
    }
