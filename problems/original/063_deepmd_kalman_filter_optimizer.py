"""The original benchmark's problem 63, exactly: one step of DeePMD-kit's LKF optimizer.

As the original's input builder makes them (a seed per rank): rank r holds 8 blocks, each with
H_i = 0.01 N(0, 1) [1024, 1], weights w_i N(0, 1) [1024, 1] and P_i the identity [1024, 1024]
(float64), and its error N(0, 1) (0-dim float64), and is called as
solution(H, error, weights, P, 0.98, 0.9987). Each rank sums lambda + H_i^T P_i H_i over its blocks,
all-reduces the sum, updates w_i <- w_i + A e P_i H_i and P_i <- (P_i - A K_i K_i^T) / lambda with
A = 1 / sum (replacing the items of its weights and P lists, so the inputs after the call are judged
too, `MUTATES_INPUTS`), gathers every rank's weights and returns (the 8 W gathered weights, its 8
P_i, lambda_next). Judged with the original harness's bounds, atol = rtol = 1e-2, no norm bound; the
inputs are drawn from secret seeds (pkb's, docs/variants.md). With these inputs A e K is about 1e-3
of a weight and P moves by about 1e-5, so a solution that skips the all-reduce stays within these
bounds and passes here (checked at W = 2 and 4), as it did in the original; pkb's variant draws
inputs where it fails.
"""

import math

import torch
import torch.distributed as dist

ID = 63
NAME = "deepmd_kalman_filter_optimizer"
CATEGORY = "DP"
SOURCE = "DeePMD-kit layer-wise Kalman filter optimizer (LKF) step"
SUMMARY = "One LKF step on 8 float64 blocks of 1024, P the identity (the original's)."
DTYPE = "float64"
WORLD_SIZES = "any world size >= 2 with 8 (W + 4) + 2 <= 1024 outputs"
PASSES_WITHOUT_EXCHANGE = (
    "A e K is about 1e-3 of a weight and P moves by about 1e-5: a solution that skips the all-reduce "
    "stays within the bounds"
)
SIZES = {"pkb": {"blocks": 8, "block": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
MUTATES_INPUTS = True  # the workload replaces the items of its weights and P lists
# 8 W gathered weights, 8 P, lambda_next, then the in-place H, error, weights and P: 98 at W = 8
MAX_OUTPUTS = 1024


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["blocks"] * (world_size + 4) + 2 > MAX_OUTPUTS:
        return "more output tensors at this world size than MAX_OUTPUTS"
    return None


def make_inputs(ctx):
    """The original's: H 0.01 N(0, 1), w N(0, 1), P the identity, e N(0, 1), lambda 0.98, nue 0.9987."""
    n, b = ctx.size["blocks"], ctx.size["block"]
    h = [ctx.randn(b, 1, scale=0.01) for _ in range(n)]
    w = [ctx.randn(b, 1) for _ in range(n)]
    eye = torch.eye(b, dtype=torch.float64, device=ctx.device)
    p = [eye.clone() for _ in range(n)]
    return h, ctx.randn(1).reshape(()), w, p, 0.98, 0.9987


@torch.no_grad()
def solution(H, error, weights, P, kalman_lambda, kalman_nue=0.9987):
    lam = torch.as_tensor(kalman_lambda, dtype=weights[0].dtype, device=weights[0].device)
    err = error.to(device=weights[0].device, dtype=weights[0].dtype)
    total = 0
    for h, p in zip(H, P, strict=True):
        total = total + (lam + h.T @ p @ h)
    dist.all_reduce(total)
    a = 1 / total
    for i in range(len(weights)):
        k = P[i] @ H[i]
        weights[i] = weights[i] + a * err * k
        P[i] = (1 / lam) * (P[i] - a * (k @ k.T))
    mine = torch.cat([w.reshape(-1) for w in weights])
    gathered = mine.new_empty(dist.get_world_size() * mine.numel())
    dist.all_gather_into_tensor(gathered, mine)
    out = [t.reshape(-1, 1) for t in gathered.split(weights[0].shape[0])]
    return out, P, kalman_nue * lam + 1 - kalman_nue


def traffic(ctx):
    """Per GPU: its weights to every peer (an all-gather) and one float64 all-reduced, in 2 rounds;
    P read and written once."""
    w, n, b = ctx.world_size, ctx.size["blocks"], ctx.size["block"]
    return {
        "nvlink_bytes": (w - 1) * (n * b * 8 + 8),
        "hbm_bytes": (2 * n * b * b + 3 * n * b + w * n * b) * 8,
        "flops": 4 * n * b * b,
        "rounds": 2,
    }
