"""Loss normalized by the global token count under gradient accumulation and data parallelism.

With gradient accumulation over micro-batches of different lengths, averaging each micro-batch's
mean loss weights tokens unequally; the correct loss divides the summed token losses by the number
of tokens in the whole global batch: all micro-batches on all W data-parallel ranks (the fix in
Hugging Face Transformers' Trainer, `num_items_in_batch` with `average_tokens_across_devices`).
Each rank therefore scales its loss by W / N instead of 1 / N, and the data-parallel step that
follows the backward pass averages the gradients over the ranks (DDP's all-reduce), which gives the
gradient of the global mean token loss.

Rank r holds, for its n_micro micro-batches, the summed token losses loss_sums bf16 [n_micro], the
token counts token_counts int64 [n_micro], and grad_sums bf16 [n_grad], the gradient of this rank's
summed (unnormalized) loss. With N = the sum of token_counts over all ranks, every rank must return
  (loss        bf16 [1]:  sum of loss_sums over all ranks / N, the global mean token loss,
   local_loss  bf16 [1]:  sum of this rank's loss_sums * W / N, the loss this rank back-propagates,
   grads       bf16 [n_grad]: the data-parallel average of every rank's grad_sums * W / N, that is
               the sum over ranks of grad_sums / N: the same on every rank).
The reference sums the losses in float64, all-reduces the pair (loss sum, token count), scales its
gradient by 1 / N in bf16 and all-reduces it in bf16 (DDP's bucket); a solution may fuse the two
all-reduces (the gradient scaled after the sum) or sum in float32.

Source: token-count normalized loss under gradient accumulation, fwd + bwd (ParallelKernelBench
problem 23). The original works on single bf16 scalars (one loss, one count, one gradient value),
which a test cannot tell from a constant fill, and stops before the gradient averaging, which left
a `large` size with nothing to communicate but 16 bytes: here the step ends with the
gradient all-reduce, as a DP step does. The pkb preset stays small and latency-bound (8
micro-batches, a 1024-element gradient); the large one averages a 256 M-element gradient (512 MiB).
Counts are random per micro-batch and rank, so a rank that normalizes by its own count is wrong;
the losses and the gradient are scaled so that all three outputs are O(1).
"""

import torch
import torch.distributed as dist

ID = 23
NAME = "grad_acc_loss"
CATEGORY = "DP"
SOURCE = "Hugging Face Transformers Trainer (loss / num_items_in_batch across devices)"
SUMMARY = "Global-token-count loss normalization, then DP gradient averaging: (mean loss, local loss, grads)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # n_micro: micro-batches per rank; max_tokens: tokens in a full micro-batch; n_grad: gradient size
    "pkb": {"n_micro": 8, "max_tokens": 4096, "n_grad": 1024},
    "large": {"n_micro": 64, "max_tokens": 8192, "n_grad": 1 << 28},
}
# All three outputs are O(1) (losses in [1, 4), gradients of RMS ~1). Correct solutions differ in
# the precision of the sums (float32 or float64; counts stay exact below 2^24 in float32), in
# whether W / N is applied before or after the gradient all-reduce and in that all-reduce's
# precision (bf16 partial sums round at every step): measured (bench/scripts/tolerance_study.py, W =
# 2, 4, 8) a relative norm of at most 0.0043 for the gradient summed in float32
# (tests/candidates/legit/023_fused_float32.py), a bf16 unit or two per element.
TOLERANCE = {"atol": 0.02, "rtol": 0.02, "rel_norm": 0.01}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any number of
    micro-batches, full micro-batches of a multiple of 256 tokens, a gradient in multiples of 8."""
    return {
        "n_micro": draw("n_micro", 1, 16),
        "max_tokens": draw("max_tokens", 1024, 6144, 256),
        "n_grad": draw("n_grad", 128, 1536, 8),
    }


def make_inputs(ctx):
    """Counts uniform in [max_tokens/8, max_tokens]; mean token loss in [1, 4) per micro-batch.

    grad_sums is Gaussian with an RMS of sqrt(W) times the expected local token count, so the
    averaged gradient (a sum of W independent terms over N) comes out O(1).
    """
    n_micro, max_tokens, n_grad = ctx.size["n_micro"], ctx.size["max_tokens"], ctx.size["n_grad"]
    token_counts = ctx.randint(max_tokens // 8, max_tokens + 1, n_micro)
    mean_loss = ctx.rand(n_micro, low=1.0, high=4.0, dtype=torch.float32)
    loss_sums = (token_counts.to(torch.float32) * mean_loss).to(ctx.dtype)
    local_tokens = n_micro * (max_tokens // 8 + max_tokens) / 2
    grad_sums = ctx.randn(n_grad, scale=local_tokens * ctx.world_size**0.5)
    return loss_sums, token_counts, grad_sums


def solution(loss_sums, token_counts, grad_sums):
    w = dist.get_world_size()
    local = torch.stack([loss_sums.sum(dtype=torch.float64), token_counts.sum().to(torch.float64)])
    total = local.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    scale = w / total[1]
    loss = (total[0] / total[1]).to(loss_sums.dtype).reshape(1)
    local_loss = (local[0] * scale).to(loss_sums.dtype).reshape(1)
    # this rank's normalized gradient (W / N) averaged over the W ranks: each term scaled by 1 / N
    grads = grad_sums * (1.0 / total[1]).to(torch.float32)
    dist.all_reduce(grads, op=dist.ReduceOp.SUM)
    return loss, local_loss, grads


def traffic(ctx):
    """Per GPU: an all-reduce of the bf16 gradient and of two float64 values (loss sum and token
    count), fused into one step by scaling the gradient after the sum.

    An all-reduce moves at least 2(W-1)/W of its buffer through each GPU's links, in at least one
    dependent step; both are lower bounds, each taken at its own minimum. Memory: read the losses,
    counts and gradient, write the gradient and the two losses.
    """
    w = ctx.world_size
    n_micro, n_grad = ctx.size["n_micro"], ctx.size["n_grad"]
    isz = ctx.dtype.itemsize
    return {
        "nvlink_bytes": 2 * (w - 1) / w * (n_grad * isz + 16),
        "hbm_bytes": n_micro * (isz + 8) + 2 * n_grad * isz + 2 * isz,
        # sums of the losses and counts, this rank's share of the gradient sum, the scaling
        "flops": 2 * n_micro + (w - 1) / w * n_grad + n_grad + 4,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(loss: torch.Tensor, local_valid_tokens: torch.Tensor, global_valid_tokens: torch.Tensor, "
        "grad_normalized_loss: torch.Tensor, grad_loss_sum: Optional[torch.Tensor] = None) "
        "-> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]"
    ),
    "args": None,
    "differences": (
        "The original works on single bf16 scalars (one loss, the local and the global token counts "
        "given as inputs, one gradient value); here each rank holds micro-batch losses, counts and a "
        "gradient vector, and the global count must be found by an all-reduce, so the original's call "
        "has no counterpart in these inputs."
    ),
}
