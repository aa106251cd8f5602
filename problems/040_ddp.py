"""One data-parallel (DDP) training step of a two-layer ReLU MLP with Adam, in mixed precision.

The model is out = relu(x W1^T + b1) W2^T + b2 with W1 [hidden, d_in], b1 [hidden],
W2 [d_out, hidden], b2 [d_out]. Its P = hidden*(d_in + 1 + d_out) + d_out parameters live in one
flat float32 vector in that order (each weight row-major), as do the two Adam moments; all three are
replicated: every rank holds the same `params`, `exp_avg`, `exp_avg_sq` [P]. Each rank holds its own
batch x [batch, d_in] and targets y [batch, d_out] in bf16. One step, on every rank:
1. forward and backward in bf16 with the parameters rounded to bf16 (as under torch.autocast): the
   gradient of this rank's loss mean((out - y)^2) (mean over its batch x d_out elements), bf16 [P];
2. gradient averaging: the sum over ranks divided by W (this is the gradient of the loss over the
   global batch, every rank's batch being the same size);
3. Adam in float32 with the averaged gradient g (step t = STEP, lr = LR, betas BETA1, BETA2, EPS):
   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
   params -= LR * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + EPS).
Every rank returns (params, exp_avg, exp_avg_sq) after the step, float32 [P], identical on every
rank. The reference writes the bf16 gradient into one flat buffer (DDP's bucket), all-reduces it in
bf16 and runs Adam unfused on all P elements on every rank; a solution may do anything that gives the
same result (for example reduce-scatter, update its 1/W of the elements, all-gather).

Data and scales. x = mu_x + N(0, 1) and y = mu_y + N(0, 1), with per-feature offsets mu_x ~ N(0, 1)
and mu_y ~ N(0, (d_out/40)^2) shared by all ranks (one data distribution, a different sample on
each rank), so the gradient has a consistent direction and an RMS of about GRAD_RMS at every size.
Weights are N(0, 1/fan_in), biases N(0, 0.1^2). The Adam states are those of an earlier step at that
gradient scale: exp_avg ~ N(0, (GRAD_RMS/2)^2), exp_avg_sq ~ U(0.5, 1.5) * GRAD_RMS^2.
Hyper-parameters: LR = 0.01 (so that one step moves a weight by ~10% of its size), BETA1 = 0.9,
BETA2 = 0.95 (one step changes v by ~5%), STEP = 4 (the bias corrections change the update by 25%).

Source: PyTorch DistributedDataParallel with Adam (ParallelKernelBench problem 40). The original
broadcasts parameters and states from rank 0 on every call (DDP's one-time sync at construction,
with the other ranks' inputs zeroed); here they are replicated inputs, as at every later step, so no
broadcast is needed. The original keeps everything in bf16 with lr 1e-3, betas (0.9, 0.999) and zero
states: the update of O(1) weights vanished in bf16 rounding, v did not change, and outputs that
skipped the step passed an absolute tolerance. Here parameters and states are float32 (mixed
precision as in torch.autocast + DDP), and the scales above make every output move visibly. The
original passes the four parameters and eight moments as separate tensors; here each is one flat
vector. The batch per rank is fixed (the original splits a global batch of 1024 samples: 128 per
rank at W = 8, the pkb size).
"""

import torch
import torch.distributed as dist

ID = 40
NAME = "ddp"
CATEGORY = "DP"
SOURCE = "PyTorch DistributedDataParallel + Adam"
SUMMARY = "DDP step of a 2-layer MLP: bf16 fwd/bwd, all-reduce grads, float32 Adam on replicated params."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # batch: this rank's samples; d_in, hidden, d_out: the MLP's widths
    "pkb": {"batch": 128, "d_in": 256, "hidden": 512, "d_out": 256},
    "large": {"batch": 4096, "d_in": 2048, "hidden": 8192, "d_out": 2048},
}
LR = 1e-2
BETA1 = 0.9
BETA2 = 0.95
EPS = 1e-8
STEP = 4  # the step being taken (1-based), for the bias corrections
GRAD_RMS = 0.03  # RMS of the averaged gradient with these data (measured), the scale of the states
# The gradient comes from bf16 GEMMs and a bf16 sum over ranks: correct solutions (another order, a
# float32 sum, float32 GEMM outputs) differ from the reference's by ~0.3% in norm, with tails where
# a ReLU input near zero flips. That reaches m through (1 - BETA1) * g (up to ~2e-4 absolute where m
# crosses zero: atol) and v through (1 - BETA2) * g^2; the parameters move by LR * (error of the
# update), ~1e-5 of their size. Together ~1.5e-4 in norm. Skipping the step moves the parameters by
# ~10% (~0.1 in norm), dropping the bias corrections changes it by 25%: both fail.
# Each output is judged on its own. The moments carry the gradient's error less diluted
# than the parameters: a float32 pipeline (bench/scripts/tolerance_study.py, W = 2, 4, 8) differs
# from the reference by a relative norm of up to m 8e-4 and v 1.5e-3 in the outputs (params, m, v);
# their bounds of their own leave about 2.5x that.
TOLERANCE = {
    "atol": 0.0005,
    "rtol": 0.02,
    "rel_norm": 0.001,
    "outputs": {
        1: {"atol": 0.0005, "rtol": 0.02, "rel_norm": 0.0025},
        2: {"atol": 0.0005, "rtol": 0.02, "rel_norm": 0.004},
    },
}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): MLP widths of 32s
    (hidden of 64s) within 1.5x pkb's GEMM work; batch 96-192, as the moments' bounds (measured
    at 128) fail a correct float32 pipeline at small batches."""
    batch, d_in, d_out = draw("batch", 96, 192, 16), draw("d_in", 64, 384, 32), draw("d_out", 64, 320, 32)
    hidden = draw("hidden", 128, max(128, min(640, 3 * 2**24 // (batch * (d_in + d_out)))), 64)
    return {"batch": batch, "d_in": d_in, "hidden": hidden, "d_out": d_out}


def _split(flat, d_in, hidden, d_out):
    """W1, b1, W2, b2 as views of a vector in the flat parameter layout."""
    n1 = hidden * d_in
    n2 = n1 + hidden
    n3 = n2 + d_out * hidden
    return flat[:n1].view(hidden, d_in), flat[n1:n2], flat[n2:n3].view(d_out, hidden), flat[n3 : n3 + d_out]


def make_inputs(ctx):
    """This rank's batch (x, y) in bf16; replicated float32 params and Adam states; the hidden width."""
    batch, d_in, hidden, d_out = (ctx.size[k] for k in ("batch", "d_in", "hidden", "d_out"))
    f32 = torch.float32
    mu_x = ctx.randn(d_in, dtype=f32, shared=True)
    mu_y = ctx.randn(d_out, dtype=f32, shared=True, scale=d_out / 40)
    x = (ctx.randn(batch, d_in, dtype=f32) + mu_x).to(ctx.dtype)
    y = (ctx.randn(batch, d_out, dtype=f32) + mu_y).to(ctx.dtype)
    params = torch.cat(
        [
            ctx.randn(hidden * d_in, dtype=f32, shared=True, scale=d_in**-0.5),
            ctx.randn(hidden, dtype=f32, shared=True, scale=0.1),
            ctx.randn(d_out * hidden, dtype=f32, shared=True, scale=hidden**-0.5),
            ctx.randn(d_out, dtype=f32, shared=True, scale=0.1),
        ]
    )
    n = params.numel()
    exp_avg = ctx.randn(n, dtype=f32, shared=True, scale=GRAD_RMS / 2)
    exp_avg_sq = ctx.rand(n, low=0.5 * GRAD_RMS**2, high=1.5 * GRAD_RMS**2, dtype=f32, shared=True)
    return x, y, params, exp_avg, exp_avg_sq, hidden


def _local_grad(x, y, weights, grad, hidden):
    """Gradient of mean((out - y)^2) over this rank's batch, written into grad (parameter layout).

    `weights` are the bf16 parameters (flat); all arithmetic is bf16 with float32 accumulation.
    """
    d_in, d_out = x.shape[1], y.shape[1]
    w1, b1, w2, b2 = _split(weights, d_in, hidden, d_out)
    g_w1, g_b1, g_w2, g_b2 = _split(grad, d_in, hidden, d_out)
    pre = torch.addmm(b1, x, w1.t())
    act = torch.relu(pre)
    out = torch.addmm(b2, act, w2.t())
    g_out = out.sub_(y).mul_(2.0 / out.numel())  # d loss / d out
    torch.mm(g_out.t(), act, out=g_w2)
    torch.sum(g_out, dim=0, out=g_b2)
    g_pre = torch.mm(g_out, w2).masked_fill_(pre <= 0, 0)  # through the ReLU
    torch.mm(g_pre.t(), x, out=g_w1)
    torch.sum(g_pre, dim=0, out=g_b1)


def _adam(params, g, exp_avg, exp_avg_sq):
    """One float32 Adam step with gradient g; returns new (params, exp_avg, exp_avg_sq)."""
    m = exp_avg.mul(BETA1).add_(g, alpha=1 - BETA1)
    v = exp_avg_sq.mul(BETA2).addcmul_(g, g, value=1 - BETA2)
    denom = v.div(1 - BETA2**STEP).sqrt_().add_(EPS)
    return params.addcdiv(m, denom, value=-LR / (1 - BETA1**STEP)), m, v


def solution(x, y, params, exp_avg, exp_avg_sq, hidden):
    grad = torch.empty(params.shape, dtype=x.dtype, device=x.device)  # the gradient bucket
    _local_grad(x, y, params.to(x.dtype), grad, hidden)
    dist.all_reduce(grad, op=dist.ReduceOp.SUM)
    g = grad.float().div_(dist.get_world_size())
    return _adam(params, g, exp_avg, exp_avg_sq)


def traffic(ctx):
    """Per GPU: an all-reduce of the bf16 gradient, 2(W-1)/W of its P elements each way.

    Every rank needs the whole averaged gradient (or the whole updated state, which is six times
    larger), so the bf16 all-reduce is the least traffic. In memory, a lower bound: the batch, the
    float32 params and both moments read once, the three written once (activations and the
    gradient not counted). FLOPs: the forward GEMMs (2 * batch * hidden * (d_in + d_out)), twice
    that backward, and ~10 per parameter for Adam.
    """
    w = ctx.world_size
    batch, d_in, hidden, d_out = (ctx.size[k] for k in ("batch", "d_in", "hidden", "d_out"))
    p = hidden * (d_in + 1 + d_out) + d_out
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * p * isz,
        "hbm_bytes": batch * (d_in + d_out) * isz + 2 * 3 * p * 4,
        "flops": 6 * batch * hidden * (d_in + d_out) + 10 * p,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(X_local: Tensor, y_local: Tensor, W1: Tensor, b1: Tensor, W2: Tensor, b2: Tensor, "
        "exp_avg_W1: Tensor, exp_avg_b1: Tensor, exp_avg_W2: Tensor, exp_avg_b2: Tensor, "
        "exp_avg_sq_W1: Tensor, exp_avg_sq_b1: Tensor, exp_avg_sq_W2: Tensor, exp_avg_sq_b2: Tensor, "
        "lr: float, beta1: float, beta2: float, eps: float, step: int) -> tuple[Tensor, ...]"
    ),
    "args": None,
    "differences": (
        "The original passes four bf16 parameters and eight bf16 moments, broadcasts them from rank 0 and"
        " returns twelve tensors; here the parameters and moments are flat float32 vectors, replicated, "
        "with a bf16 forward and backward and a float32 Adam: an original file, computing in one dtype, "
        "cannot produce this mixed-precision step's outputs."
    ),
}
