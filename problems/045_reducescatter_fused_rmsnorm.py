"""Reduce-scatter of partial activations along the tokens, then RMSNorm of this rank's tokens.

Where a sequence-parallel transformer leaves a row-parallel layer: every rank holds a partial
result for all tokens, partial [T, H] in bf16 (its share of the attention output projection or the
second MLP GEMM), and the sum over ranks is the layer's output. Rank r owns tokens r*T/W ..
(r+1)*T/W and must return RMSNorm of its rows of the sum:

    x = (sum over ranks s of partial_s)[r*T/W : (r+1)*T/W]       (bf16 reduce-scatter)
    out = x * rsqrt(mean over H of x^2 + EPS) * gamma              [T/W, H] in bf16

with gamma [H] the norm's weight, the same on every rank. The reference reduce-scatters in bf16,
normalizes in float32 and rounds to bf16 once at the end.

Source: reduce-scatter fused with RMSNorm (ParallelKernelBench problem 45). The original passes a
flat [T*H] buffer and averages over the ranks before normalizing; RMSNorm cancels that scale (up to
EPS), so here the rows are 2-D and the partial results are summed, as the reduce-scatter of a
row-parallel layer does. The sizes are the original's (T = 1024 tokens, H = 128: a [131072] buffer
per rank, 128 tokens out per rank at 8 ranks).
"""

import torch
import torch.distributed as dist

ID = 45
NAME = "reducescatter_fused_rmsnorm"
CATEGORY = "TP/SP"
SOURCE = "sequence-parallel transformer: row-parallel output reduce-scatter + RMSNorm"
SUMMARY = "Reduce-scatter bf16 partials [T, H] along tokens, then RMSNorm with gamma: [T/W, H]."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing tokens"
SIZES = {
    # tokens: rows of every rank's partial result (split across ranks by the reduce-scatter); hidden
    "pkb": {"tokens": 1024, "hidden": 128},
    "large": {"tokens": 32768, "hidden": 8192},
}
EPS = 1e-6
# Outputs are O(1) (up to about 6 with gamma up to 1.5). The sum of bf16 partials is rounded at every
# addition in an order the collective chooses; a solution summing in float32, or in another order,
# differs by a few units in the last place of the sum. Measured at 8 ranks: at most 0.65 of this
# bound elementwise, relative norm 0.0055.
TOLERANCE = {"atol": 0.05, "rtol": 0.03, "rel_norm": 0.01}

# torch 2.13 renamed reduce_scatter_tensor to reduce_scatter_single; both run the same collective.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["tokens"] % world_size:
        return f"tokens = {size['tokens']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): tokens a multiple of
    8 W (every rank owns a whole number of 8-row tiles), hidden a multiple of 16."""
    return {
        "tokens": draw("tokens", 16 * world_size, 1536, 8 * world_size),
        "hidden": draw("hidden", 64, 256, 16),
    }


def make_inputs(ctx):
    """partial [T, H] ~ N(0, 1), different per rank; gamma [H] uniform in [0.5, 1.5), shared."""
    tokens, hidden = ctx.size["tokens"], ctx.size["hidden"]
    partial = ctx.randn(tokens, hidden)
    gamma = ctx.rand(hidden, low=0.5, high=1.5, shared=True)
    return partial, gamma


def solution(partial, gamma):
    summed = partial.new_empty(partial.shape[0] // dist.get_world_size(), partial.shape[1])
    _reduce_scatter(summed, partial, op=dist.ReduceOp.SUM)
    x = summed.to(torch.float32)
    x.mul_(torch.rsqrt(x.square().mean(dim=-1, keepdim=True).add_(EPS)))
    x.mul_(gamma)
    return x.to(partial.dtype)


def traffic(ctx):
    """Per GPU: each of the W-1 foreign row blocks of its partial result goes to that block's owner.

    HBM: read the partial result and gamma, write the [T/W, H] output.
    """
    w = ctx.world_size
    tokens, hidden = ctx.size["tokens"], ctx.size["hidden"]
    isz = ctx.dtype.itemsize
    rows = tokens // w
    return {
        "nvlink_bytes": (w - 1) * rows * hidden * isz,
        "hbm_bytes": (tokens * hidden + hidden + rows * hidden) * isz,
        # this rank's share of the sum, then square-and-add and two multiplies per output element
        "flops": (w - 1) * rows * hidden + 4 * rows * hidden,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": "solution(rs_input_1d: Tensor, gamma: Tensor, eps: float) -> Tensor",
    "args": lambda inputs, env: (inputs[0].view(-1), inputs[1], EPS),
    "outputs": lambda out, args, env: out.view(-1, args[1].shape[0]),  # [T/W, H], also from a flat result
    "differences": (
        "rs_input_1d is the flat view of partial [T, H] and eps is this problem's EPS; the original "
        "averages over the ranks before normalizing, which RMSNorm cancels up to eps, so its result is "
        "judged against the sum's."
    ),
}
