"""The Mixtral router's auxiliary load-balancing loss, averaged over data-parallel ranks.

Every rank holds its tokens' router logits, gate_logits bf16 [tokens, num_experts]. Per rank, as in
Hugging Face Transformers' `load_balancing_loss_fn` (Switch Transformer eq. 4-6):

  P     = softmax(gate_logits) over the experts            [tokens, E], float32
  f[e]  = (number of (token, j) with expert e among the token's top_k logits) / tokens
  loss_r = E * sum over e of f[e] * mean over tokens of P[:, e]

Every rank must return the mean of loss_r over all ranks, a 0-dim float32 tensor, as the original
returns it (the loss data parallelism trains on; its gradient is what DDP's averaging produces). The
reference computes P in float32 from the bf16 logits, picks the top_k experts from the logits
(softmax keeps their order), counts them without a host synchronization, and all-reduces the one
float32 loss.

Source: Hugging Face Transformers' Mixtral `load_balancing_loss_fn` (ParallelKernelBench problem 24).
The signature and the call (gate_logits, num_experts, 2, None) are the original's: top_k is 2 and
attention_mask None (no padding), as the original's harness passes. gate_logits may also be a tuple
of per-layer logits, which are concatenated along the tokens, as Transformers does.

Differences from the original: none in the call or the output (an original file passes unchanged).
Its inputs are unlike the original's: each rank's router has its own random bias per expert, small on
rank 0 and large on rank W-1, so ranks route unevenly, each rank's loss differs from the mean by more
than 10% and a rank that skips the all-reduce fails.
"""

import torch
import torch.distributed as dist

ID = 24
NAME = "load_balancing_loss_fn"
CATEGORY = "MoE"
SOURCE = "Hugging Face Transformers Mixtral load_balancing_loss_fn"
SUMMARY = "Mixtral auxiliary load-balancing loss of bf16 router logits [T, E], top-2, mean over ranks."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # tokens: this rank's tokens; experts: E; top_k: experts per token
    "pkb": {"tokens": 1024, "experts": 8, "top_k": 2},
    # 512 MiB of logits per rank; the reference's softmax, top-k, comparison and means move about
    # 5 GB of HBM, about 1.3 ms by bandwidth, but it measured 70 ms on 2 H200s (2026-11-26,
    # docs/gpu-results.md): which of its operations takes the time is not yet known
    "large": {"tokens": 1 << 25, "experts": 8, "top_k": 2},
}
# Why the exchange cannot be a material part of the floor (docs/problem-format.md, MINOR_EXCHANGE;
# figures at the datasheet's ceilings, bench/scripts/comm_share.py)
MINOR_EXCHANGE = (
    "the exchange is one float32 loss a rank (8 bytes through each GPU) against the router logits "
    "read: the bytes are nothing and the one round's 5 us is 0.5% of a 1 ms floor, less as the tokens "
    "grow"
)
# Measured on CPU against a float64 computation (T = 1024 and 8192, W = 2, 4, 8, 40 trials each):
# Transformers' own arithmetic (bf16 softmax, top-k of the bf16 probabilities, bf16 mean) differs by
# up to 0.28%, and breaking top-k ties the other way by up to 0.21% (bf16 logits tie in ~1% of
# tokens, and tied experts differ in their mean probability). A rank that skips the all-reduce is
# off by at least 13% at W = 2 (300 trials), a sum instead of a mean by a factor of W.
TOLERANCE = {"atol": 0.0, "rtol": 0.01, "rel_norm": 0.01}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): tokens in 8s near
    the pkb size the tolerance was measured at (a top-k tie weighs 1/tokens), experts in 4s, top_k below."""
    experts = draw("experts", 4, 16, 4)
    return {
        "tokens": draw("tokens", 512, 1536, 8),
        "experts": experts,
        "top_k": draw("top_k", 1, min(4, experts - 1)),
    }


def make_inputs(ctx):
    """Standard normal logits plus a random bias per expert whose scale grows with the rank.

    The bias has standard deviation 0.25 on rank 0 and 3 on rank W-1 (linearly between), so rank 0
    routes almost evenly (loss near top_k) and the last rank unevenly (loss several times larger).
    """
    tokens, experts, top_k = ctx.size["tokens"], ctx.size["experts"], ctx.size["top_k"]
    spread = 0.25 + 2.75 * ctx.rank / (ctx.world_size - 1)
    bias = ctx.randn(experts, dtype=torch.float32, scale=spread)
    logits = (ctx.randn(tokens, experts, dtype=torch.float32) + bias).to(ctx.dtype)
    return logits, experts, top_k, None


def solution(gate_logits, num_experts, top_k=2, attention_mask=None):
    if attention_mask is not None:
        raise ValueError("this workload has no attention mask (the original's harness passes None)")
    if isinstance(gate_logits, (tuple, list)):
        gate_logits = torch.cat(list(gate_logits), dim=0)
    tokens = gate_logits.shape[0]
    prob_mean = torch.softmax(gate_logits, dim=-1, dtype=torch.float32).mean(dim=0)
    selected = torch.topk(gate_logits, top_k, dim=-1).indices
    experts = torch.arange(num_experts, device=gate_logits.device)
    # counts by comparison: bincount and one_hot would read the indices' range back to the host
    counts = (selected.unsqueeze(-1) == experts).sum(dim=(0, 1)).to(torch.float32)
    loss = torch.dot(counts, prob_mean) * (num_experts / tokens)  # 0-dim, as the original's
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    return loss.div_(dist.get_world_size())


def traffic(ctx):
    """Per GPU: one float32 loss from every rank reaches every rank; the logits are read once.

    Each field is the minimum over schedules (they need not be the same one). Fewest bytes: pass the
    partial sum once around a ring and the total once more, 8 bytes through each GPU (4 at W = 2);
    none does with less at W >= 3 (the receiver of the first message, which holds one rank's loss
    only, needs a second). Recursive doubling sends 4 log2(W) bytes, a one-shot all-reduce
    (W-1) x 4 but in one round, the latency term's. FLOPs: the softmax (max, subtract,
    exponentiate, sum, divide), its mean and the top-k comparisons, about 8 per logit.
    """
    elems = ctx.size["tokens"] * ctx.size["experts"]
    return {
        "nvlink_bytes": 4 if ctx.world_size == 2 else 8,
        "hbm_bytes": elems * ctx.dtype.itemsize,
        "flops": 8 * elems,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(gate_logits, num_experts, top_k=2, attention_mask=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "none in the call or the output (an original file passes unchanged). Its inputs are unlike the "
        "original's: each rank's router has its own random bias per expert, small on rank 0 and large on "
        "rank W-1, so ranks route unevenly, each rank's loss differs from the mean by more than 10% and a "
        "rank that skips the all-reduce fails."
    ),
}
