"""The original benchmark's problem 47, exactly: one FSDP training step of a two-layer MLP with AdamW.

As the original's input builder makes them (bf16, drawn once for all ranks): a batch of 1024 rows,
X [1024, 256] and y [1024, 256] standard normal, of which rank r holds rows r * 1024 / W ..
(r + 1) * 1024 / W - 1 (X_local, y_local); an MLP W1 [H, 256], b1 [H], W2 [256, H], b2 [256]
(H = 512, or the least H above it that makes the parameter count P divisible by W) flattened in
that order, of which rank r holds elements r P / W .. (r + 1) P / W - 1, flat_param_shard; and zero
AdamW moments exp_avg_shard, exp_avg_sq_shard [P / W]. Only rank 0 draws the parameters; every
other rank builds them as zeros, so rank r > 0 holds a zero shard. Called as solution(X_local,
y_local, flat_param_shard, param_shapes, exp_avg_shard, exp_avg_sq_shard, 1e-3, 0.9, 0.999, 1e-8,
0.01, step), step = 1 + trial % 7 in the original (here drawn from 1 .. 7 per trial, the same on
every rank). Each rank all-gathers the parameters, computes the mean squared error of
relu(X_local W1^T + b1) W2^T + b2 against y_local and its gradient in bf16 (autograd),
reduce-scatters the flat gradient and divides it by W, then takes an AdamW step on its shard
(theta -= lr m_hat / (sqrt(v_hat) + eps) + lr wd theta) and returns (theta, m, v), bf16 [P / W]
each. Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are
drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: everything. The gathered model is rank 0's shard followed by zeros,
so at every W >= 2 W2 and b2 are zero: the MLP's output is zero and the gradients of W1 and b1 are
zero. Rank 0's shard (within W1 and b1) only decays by lr wd = 1e-5 of itself, every other rank's
moves by at most lr = 1e-3 from zero, and the moments stay far below atol. Returning
(flat_param_shard, zeros, zeros) without communicating passes. The `pkb` variant (random parameters
on every rank, float32 state) was redesigned for this.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 47
NAME = "fsdp_step_e2e"
CATEGORY = "FSDP"
SOURCE = "PyTorch FSDP (ZeRO-3) with AdamW"
SUMMARY = "FSDP step of a bf16 256-512-256 MLP (rank 0's shard random, the rest zero) with AdamW."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "the gathered model's second layer is zero, so the output and the first layer's gradients are "
    "zero without any exchange"
)
SIZES = {"pkb": {"m": 1024, "n": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.999, 1e-8, 0.01

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _dims(ctx):
    """(rows of the whole batch, d_in, hidden, d_out), as the original's builder picks them."""
    n, w = ctx.size["n"], ctx.world_size
    d_in, d_out, hidden = max(16, min(n, 256)), max(8, min(n // 4, 256)), max(32, min(n // 2, 512))
    while (hidden * (d_in + 1 + d_out) + d_out) % w:
        hidden += 1
    rows = -(-max(ctx.size["m"], w) // w) * w
    return rows, d_in, hidden, d_out


def make_inputs(ctx):
    """The original's: rows of one shared batch; rank 0's parameter shard random, the others zero."""
    rows, d_in, hidden, d_out = _dims(ctx)
    w, r = ctx.world_size, ctx.rank
    chunk = rows // w
    x = ctx.randn(rows, d_in, shared=True)[r * chunk : (r + 1) * chunk].clone()
    y = ctx.randn(rows, d_out, shared=True)[r * chunk : (r + 1) * chunk].clone()
    total = hidden * (d_in + 1 + d_out) + d_out
    part = total // w
    shard = ctx.randn(part) if r == 0 else ctx.full((part,), 0.0)
    shapes = ((hidden, d_in), (hidden,), (d_out, hidden), (d_out,))
    step = 1 if ctx.is_meta else 1 + int(ctx.randint(0, 7, 1, shared=True))
    zeros = ctx.full((part,), 0.0)
    return x, y, shard, shapes, zeros, zeros.clone(), LR, BETA1, BETA2, EPS, WEIGHT_DECAY, step


def solution(
    X_local,
    y_local,
    flat_param_shard,
    param_shapes,
    exp_avg_shard,
    exp_avg_sq_shard,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    step,
):
    w = dist.get_world_size()
    p = flat_param_shard.numel()
    flat = flat_param_shard.new_empty(w * p)
    _all_gather(flat, flat_param_shard.contiguous())
    with torch.enable_grad():
        flat.requires_grad_(True)
        sizes = [math.prod(s) for s in param_shapes]
        w1, b1, w2, b2 = (t.view(s) for t, s in zip(flat.split(sizes), param_shapes, strict=True))
        loss = F.mse_loss(F.linear(F.relu(F.linear(X_local, w1, b1)), w2, b2), y_local)
        (grad,) = torch.autograd.grad(loss, flat)
    g = grad.new_empty(p)
    dist.reduce_scatter_tensor(g, grad.contiguous(), op=dist.ReduceOp.SUM)
    g.div_(w)
    with torch.no_grad():
        m = exp_avg_shard.mul(beta1).add_(g, alpha=1.0 - beta1)
        v = exp_avg_sq_shard.mul(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.div(1.0 - beta2**step).sqrt_().add_(eps)
        theta = flat_param_shard.add(m.div(1.0 - beta1**step).div_(denom), alpha=-lr)
        theta.add_(flat_param_shard, alpha=-lr * weight_decay)
    return theta, m, v


def traffic(ctx):
    """Per GPU: the all-gather of the parameter shards and the reduce-scatter of the gradient, (W - 1)
    shards each way for each (see the docstring for what the original's inputs let a solution skip).
    Memory: the batch and this rank's three shards read, the three written. FLOPs: the forward
    GEMMs, twice that backward, ~12 an element for AdamW."""
    rows, d_in, hidden, d_out = _dims(ctx)
    w, isz = ctx.world_size, ctx.dtype.itemsize
    part = (hidden * (d_in + 1 + d_out) + d_out) // w
    chunk = rows // w
    return {
        "nvlink_bytes": 2 * (w - 1) * part * isz,
        "hbm_bytes": (chunk * (d_in + d_out) + 6 * part) * isz,
        "flops": 6 * chunk * hidden * (d_in + d_out) + 12 * part,
        "rounds": 2,
    }
