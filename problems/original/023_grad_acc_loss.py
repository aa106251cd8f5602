"""The original benchmark's problem 23, exactly: a loss normalized by the global token count and its gradient.

As the original's input builder makes them: rank r holds one bf16 loss (standard normal, a seed per
rank), its valid token count 1024 * 1024 and the global count W * 1024 * 1024 (int64 0-dim
tensors), the incoming gradient of the normalized loss (bf16 1) and that of the loss sum (bf16 0),
and is called as solution(loss, local, global, grad_normalized, grad_sum). Forward: loss_sum = loss
* local (bf16), all-reduced in bf16, and normalized_loss = loss_sum / global; backward: grad_loss =
grad_normalized * local / global + grad_sum * local. Every rank returns (normalized_loss, loss_sum,
grad_loss), bf16 0-dim tensors. Judged as the original harness judges: atol = rtol = 1e-2, no norm
bound; the losses are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: nothing of the forward pass, whose sum over ranks is random; the
backward output is 1 / W on every rank, known from the constant inputs, and needs no communication
in the original either.
"""

import math

import torch
import torch.distributed as dist

ID = 23
NAME = "grad_acc_loss"
CATEGORY = "DP"
SOURCE = "Hugging Face Transformers Trainer (loss / num_items_in_batch across devices)"
SUMMARY = "Token-count normalized bf16 scalar loss, summed over ranks, and its gradient (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = "the backward output is 1 / W on every rank, known from the constant inputs"
SIZES = {"pkb": {"rows": 1024, "cols": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: a standard normal loss, counts of rows * cols tokens per rank, incoming
    gradients 1 and 0."""
    tokens = ctx.size["rows"] * ctx.size["cols"]
    loss = ctx.randn(1).reshape(())  # a 0-dim loss
    local = ctx.full((), tokens, dtype=torch.int64)
    total = ctx.full((), ctx.world_size * tokens, dtype=torch.int64)
    return loss, local, total, ctx.full((), 1.0), ctx.full((), 0.0)


def solution(loss, local_valid_tokens, global_valid_tokens, grad_normalized_loss, grad_loss_sum=None):
    if local_valid_tokens.item() == 0:
        loss = torch.nan_to_num(loss)
    loss_sum = loss * local_valid_tokens
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    normalized_loss = loss_sum / global_valid_tokens
    grad_loss = grad_normalized_loss * local_valid_tokens / global_valid_tokens
    if grad_loss_sum is not None:
        grad_loss = grad_loss + grad_loss_sum * local_valid_tokens
    return normalized_loss, loss_sum, grad_loss


def traffic(ctx):
    """Per GPU: one bf16 loss sum to every peer (a one-shot all-reduce); a few scalars in memory."""
    return {
        "nvlink_bytes": (ctx.world_size - 1) * ctx.dtype.itemsize,
        "hbm_bytes": 8 * ctx.dtype.itemsize + 2 * 8,
        "flops": 8,
        "rounds": 1,
    }
