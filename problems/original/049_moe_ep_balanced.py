"""The original benchmark's problem 49, exactly: an expert-parallel MoE forward with one expert per rank.

As the original's input builder makes them (a seed per rank, all bf16): rank r holds 1024 tokens
hidden_states [1024, 1024] ~ N(0, 1), a router of its own, gate_weight [W, 1024] and gate_bias [W] ~
N(0, 1), and its expert's MLP as three nn.Linear modules in PyTorch's default initialisation
(uniform in +-1/sqrt(fan_in)), gate_proj and up_proj (1024 -> 128) and down_proj (128 -> 1024),
whose parameters require gradients; it is called as solution(hidden_states, gate_weight, gate_bias,
gate_proj, up_proj, down_proj, W, 2, None). Each token goes, through an all-to-all, to the ranks of
the top 2 of W experts of its router's bf16 softmax; each rank runs its MLP, down(silu(gate(x)) *
up(x)), on what it receives, and the outputs come back, are scaled by their routing probabilities
and summed in bf16: every rank returns bf16 [1024, 1024] (the original's output carries the autograd
graph of its parameters; the values are judged).

Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 49
NAME = "moe_ep_balanced"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM MoE all-to-all token dispatcher with a SiLU expert MLP"
SUMMARY = "MoE forward, one expert per rank, 1024 tokens of 1024, MLP width 128, top 2 (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (experts = world size)"
SIZES = {"pkb": {"tokens": 1024, "hidden": 1024, "inter": 128, "top_k": 2}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _linear(ctx, fan_in, fan_out):
    """PyTorch's default nn.Linear: weight and bias uniform in +-1/sqrt(fan_in), requiring gradients."""
    lin = torch.nn.utils.skip_init(torch.nn.Linear, fan_in, fan_out, device=ctx.device, dtype=ctx.dtype)
    bound = fan_in**-0.5
    with torch.no_grad():
        lin.weight.copy_(ctx.rand(fan_out, fan_in, low=-bound, high=bound))
        lin.bias.copy_(ctx.rand(fan_out, low=-bound, high=bound))
    return lin


def make_inputs(ctx):
    """The original's: N(0, 1) tokens and router, default-initialised expert MLP, all per rank."""
    s = ctx.size
    hidden, inter, experts = s["hidden"], s["inter"], ctx.world_size
    return (
        ctx.randn(s["tokens"], hidden),
        ctx.randn(experts, hidden),
        ctx.randn(experts),
        _linear(ctx, hidden, inter),
        _linear(ctx, hidden, inter),
        _linear(ctx, inter, hidden),
        experts,
        s["top_k"],
        None,
    )


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    group = group or dist.group.WORLD
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    hidden = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden)
    probs, chosen = torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1).topk(top_k, dim=-1)
    flat = chosen.reshape(-1)
    order = flat.argsort(stable=True)  # (token, choice) pairs grouped by expert: one expert per rank
    token = order // top_k
    counts = torch.bincount(flat, minlength=num_experts)
    every = counts.new_empty(w * num_experts)
    _all_gather(every, counts, group=group)
    pairs = every.view(w, num_experts).cpu()  # [p, q]: tokens rank p sends rank q
    send, receive = pairs[rank].tolist(), pairs[:, rank].tolist()
    dispatched = x.new_empty(sum(receive), hidden)
    dist.all_to_all_single(dispatched, x.index_select(0, token), receive, send, group=group)
    y = down_proj(F.silu(gate_proj(dispatched)) * up_proj(dispatched))
    back = y.new_empty(flat.numel(), hidden)
    dist.all_to_all_single(back, y, send, receive, group=group)
    weighted = back * probs.reshape(-1).index_select(0, order).unsqueeze(1)  # bf16, as the original
    return torch.zeros_like(x, dtype=weighted.dtype).index_add(0, token, weighted)


def traffic(ctx):
    """Per GPU, the least of two schedules (problems/049_moe_ep_balanced.py's traffic): the tokens
    to their experts and back, or the other experts' MLPs to every rank; memory and FLOPs likewise.

    The remote (token, expert) pairs are their expected number, T k (W - 1) / W: the original's
    routing is random."""
    s, w = ctx.size, ctx.world_size
    tokens, hidden, inter, top_k = s["tokens"], s["hidden"], s["inter"], s["top_k"]
    remote_pairs = tokens * top_k * (w - 1) // w
    mlp = 3 * hidden * inter + 2 * inter + hidden
    return {
        "nvlink_bytes": min(2 * remote_pairs * hidden, (w - 1) * mlp) * ctx.dtype.itemsize,
        "hbm_bytes": (2 * tokens * hidden + w * (hidden + 1) + mlp) * ctx.dtype.itemsize,
        "flops": 2 * tokens * hidden * w + tokens * top_k * 6 * hidden * inter,
        "rounds": 1,
    }
