"""The original benchmark's problem 51, exactly: an expert-parallel MoE forward in EP groups of E < W ranks.

As the original's input builder makes them (a seed per rank, all bf16), with E the largest divisor
of W from 2 to W / 2, else 1 (E = 1 at W = 2, 2 at W = 4, 4 at W = 8) and top_k = min(2, E): rank r
holds 1024 tokens hidden_states [1024, 1024] ~ N(0, 1), a router of its own, gate_weight [E, 1024]
and gate_bias [E] ~ N(0, 1), and its expert's MLP as three nn.Linear modules in PyTorch's default
initialisation (uniform in +-1/sqrt(fan_in)), gate_proj and up_proj (1024 -> 128) and down_proj (128
-> 1024), whose parameters require gradients; it is called as solution(hidden_states, gate_weight,
gate_bias, gate_proj, up_proj, down_proj, E, top_k, None). Group None means this rank's EP group:
the W / E groups of E consecutive ranks, created on the first call and cached (every rank creates
every group, in the same order). Within its group each token goes, through an all-to-all, to the
ranks of the top_k of E experts of its router's bf16 softmax (expert e on the group's e-th rank);
each rank runs its MLP, down(silu(gate(x)) * up(x)), on what it receives, and the outputs come back,
are scaled by their routing probabilities and summed in bf16: every rank returns bf16 [1024, 1024]
(the original's output carries the autograd graph of its parameters; the values are judged). At W =
2 the groups have one rank, and nothing is exchanged.

Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 51
NAME = "moe_ep_narrow"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM MoE all-to-all token dispatcher with a SiLU expert MLP"
SUMMARY = "MoE forward in EP groups of E < W ranks, 1024 tokens of 1024, MLP width 128 (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (E experts, W / E EP groups; E = 1 at W = 2 and any prime W)"
PASSES_WITHOUT_EXCHANGE = {2: "at W = 2 the EP groups have one rank each, and nothing is exchanged"}
SIZES = {"pkb": {"tokens": 1024, "hidden": 1024, "inter": 128, "top_k": 2}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_GROUPS = {}  # (world size, experts) -> this rank's EP group


def num_experts(world_size):
    """The original's E: the largest divisor of W from 2 to W / 2, else 1."""
    return next((e for e in range(world_size // 2, 1, -1) if world_size % e == 0), 1)


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
    hidden, inter, experts = s["hidden"], s["inter"], num_experts(ctx.world_size)
    return (
        ctx.randn(s["tokens"], hidden),
        ctx.randn(experts, hidden),
        ctx.randn(experts),
        _linear(ctx, hidden, inter),
        _linear(ctx, hidden, inter),
        _linear(ctx, inter, hidden),
        experts,
        min(s["top_k"], experts),
        None,
    )


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    group = group or _ep_group(num_experts)
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


def _ep_group(experts):
    """This rank's EP group: the world when E >= W, else its E consecutive ranks (all groups made on
    the first call)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if experts >= world:
        return dist.group.WORLD
    if (world, experts) not in _GROUPS:
        for g in range(world // experts):
            group = dist.new_group(list(range(g * experts, (g + 1) * experts)))
            if rank // experts == g:
                _GROUPS[world, experts] = group
    return _GROUPS[world, experts]


def traffic(ctx):
    """Per GPU, the least of two schedules within the EP group of E ranks
    (problems/051_moe_ep_narrow.py's traffic): the tokens to their experts and back, or the other
    experts' MLPs to every rank; memory and FLOPs likewise. Nothing crosses a link when E = 1.

    The remote (token, expert) pairs are their expected number, T k (E - 1) / E: the original's
    routing is random."""
    s = ctx.size
    w = num_experts(ctx.world_size)  # the EP group's size
    tokens, hidden, inter, top_k = s["tokens"], s["hidden"], s["inter"], min(s["top_k"], w)
    remote_pairs = tokens * top_k * (w - 1) // w
    mlp = 3 * hidden * inter + 2 * inter + hidden
    return {
        "nvlink_bytes": min(2 * remote_pairs * hidden, (w - 1) * mlp) * ctx.dtype.itemsize,
        "hbm_bytes": (2 * tokens * hidden + w * (hidden + 1) + mlp) * ctx.dtype.itemsize,
        "flops": 2 * tokens * hidden * w + tokens * top_k * 6 * hidden * inter,
        "rounds": 1 if w > 1 else 0,
    }
