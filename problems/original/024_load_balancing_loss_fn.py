"""The original benchmark's problem 24, exactly: Mixtral's load-balancing loss, averaged over ranks.

As the original's input builder makes them (a seed per rank): rank r holds gate_logits [1024, 8] bf16,
standard normal, and is called as solution(gate_logits, 8, 2, None). Each rank computes Hugging Face
Transformers' `load_balancing_loss_fn` the way Transformers does (bf16 softmax, top-2 of the
probabilities, a one-hot expert mask, the means), all-reduces the float32 loss and divides it by W:
every rank returns the mean, a 0-dim float32 tensor. Judged as the original harness judges: atol =
rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: with unbiased logits every rank's own loss is within a few thousandths
of the mean (at most 13% of the tolerance in 200 trials at W = 2, computed on CPU), so a rank that
returns its own loss without the all-reduce passes. The `pkb` variant biases each rank's router so
that it cannot.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 24
NAME = "load_balancing_loss_fn"
CATEGORY = "MoE"
SOURCE = "Hugging Face Transformers Mixtral load_balancing_loss_fn"
SUMMARY = "Mixtral auxiliary loss of bf16 router logits [1024, 8], top-2, mean over ranks (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
PASSES_WITHOUT_EXCHANGE = (
    "every rank's own loss is within a few thousandths of the mean, so its own loss, not all-reduced, passes"
)
SIZES = {"pkb": {"tokens": 1024, "experts": 8, "top_k": 2}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: standard normal logits; 8 experts, top-2, no attention mask."""
    s = ctx.size
    return ctx.randn(s["tokens"], s["experts"]), s["experts"], s["top_k"], None


def solution(gate_logits, num_experts, top_k=2, attention_mask=None):
    if attention_mask is not None:
        raise ValueError("the original's harness passes no attention mask")
    if isinstance(gate_logits, (tuple, list)):
        gate_logits = torch.cat(list(gate_logits), dim=0)
    probs = F.softmax(gate_logits, dim=-1)
    selected = torch.topk(probs, top_k, dim=-1).indices
    tokens_per_expert = F.one_hot(selected, num_experts).float().mean(dim=0)
    loss = torch.sum(tokens_per_expert * probs.mean(dim=0).unsqueeze(0)) * num_experts
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    return loss / dist.get_world_size()


def traffic(ctx):
    """Per GPU: one float32 loss around a ring and back (4 bytes at W = 2, 8 above); the logits read
    once, about 8 FLOPs each."""
    elems = ctx.size["tokens"] * ctx.size["experts"]
    return {
        "nvlink_bytes": 4 if ctx.world_size == 2 else 8,
        "hbm_bytes": elems * ctx.dtype.itemsize,
        "flops": 8 * elems,
        "rounds": 1,
    }
