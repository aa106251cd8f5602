"""Expert-parallel MoE forward, balanced: one expert per rank, tokens dispatched to it and combined back.

Layer (Mixtral / VeOmni style): E = W experts, expert e held by rank e. Rank r holds its own tokens
hidden_states bf16 [T, H], the router gate_weight bf16 [E, H] and gate_bias bf16 [E] (the same on
every rank), and its expert's SiLU MLP as three nn.Linear modules, gate_proj and up_proj (H -> I) and
down_proj (I -> H), with weights and biases of its own. Every rank must return, for each of its
tokens x,

  out[t] = sum over the top_k experts e of softmax(x gate_weight^T + gate_bias)[e] * MLP_e(x)
  MLP_e(x) = down_proj_e(silu(gate_proj_e(x)) * up_proj_e(x))          (bf16 [T, H])

so each token must reach the rank of each expert it chose, and its expert outputs must come back.
The reference routes (softmax, top_k), all-gathers every rank's per-expert counts, reads the split
sizes on the host (one sync), all-to-alls the tokens to their experts' ranks, runs the MLP there,
all-to-alls the outputs back and sums them with their routing weights in float32.

Source: VeOmni's / Megatron-LM's MoE all-to-all token dispatcher around a SiLU expert MLP
(ParallelKernelBench problem 49: problem 31's layer with one expert per rank). The signature and the
call (hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, E, top_k, None) are the
original's; group None is the default (world) group.

Inputs: the routing is drawn first and the tokens are made to follow it. Each rank chooses exactly
T * top_k / W of its tokens, at random, to use its own expert; the others' choices are random among
the remote experts, so the split sizes vary by rank and trial while the number of (token, remote
expert) pairs is fixed. The hidden states are N(0, 1) noise corrected (in float64, then rounded to
bf16) so that the router's logits are drawn targets (up to bf16 rounding): in [2, 3) for the chosen
experts and in [-1, 0) for the others, a gap of 1 that keeps bf16 and float32 routers from choosing
differently. Router rows are N(0, 1/H); the MLP weights N(0, 1/fan_in) and biases N(0, 0.1^2), so
outputs are O(1).

Differences from the original:
- The original routes with a router of each rank's own (weights drawn per rank) on plain N(0, 1)
  tokens, whose logits of standard deviation 32 are rounded to bf16 steps of 0.25, so a solution with
  a float32 router may choose other experts; here the router is the same on every rank (a MoE layer's
  router is replicated) and the routing has a clear margin.
- The linear modules' parameters do not require gradients (the original's do, so its output carries an
  autograd graph); the forward pass is the same.
- The original scales and sums each token's expert outputs in bf16; the reference sums in float32 and
  rounds once (the difference is within the tolerance).
- The original sorts the received tokens by local expert before the MLP and back after it; with one
  expert per rank this is the identity, so the reference does not.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 49
NAME = "moe_ep_balanced"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM MoE all-to-all token dispatcher with a SiLU expert MLP"
SUMMARY = (
    "MoE forward with one expert per rank: route, all-to-all tokens, SiLU MLP, all-to-all back, combine."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (experts = world size)"
# tokens: T per rank; hidden: H; inter: I (the expert MLP's width); top_k: experts per token.
# large: DeepSeek-V3's expert shape (H 7168, I 2048) over 8192 tokens per rank: 1.4 TFLOP of expert
# GEMMs per rank, about 1.8 ms at an H200's 790 TFLOP/s, and 235 MB of tokens each way per rank at
# W = 2 (an estimate until measured).
SIZES = {
    "pkb": {"tokens": 1024, "hidden": 1024, "inter": 128, "top_k": 2},
    "large": {"tokens": 8192, "hidden": 7168, "inter": 2048, "top_k": 2},
}
# Measured on CPU against a float64 twin (tests/candidates/by_problem/049_float64.py; W = 2, 3 trials,
# and W = 4, 2 trials): worst elementwise error 3.1e-2, relative norm 5.7e-3 (bf16 rounds the MLP's
# three GEMMs and its product). The original's bf16 arithmetic (049_original_style.py): 1.6e-2 and
# 2.8e-3. Skipping the exchange is off by about half the output.
TOLERANCE = {"atol": 3e-2, "rtol": 3e-2, "rel_norm": 1.5e-2}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def num_experts(world_size):
    """E = W: one expert per rank."""
    return world_size


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["top_k"] > world_size:
        return f"top_k = {size['top_k']} is more than the {world_size} experts"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): top_k of 1 to 4 (at most
    W, one expert each), hidden and inter of 64s, up to 2048 tokens of 8s, expert work within pkb's."""
    top_k = draw("top_k", 1, max(1, min(world_size, 4)))
    hidden = draw("hidden", 256, 1536, 64)
    inter = draw("inter", 64, 256, 64)
    tokens = draw("tokens", 64, max(64, min(2048, 2**28 // (top_k * hidden * inter))), 8)
    return {"tokens": tokens, "hidden": hidden, "inter": inter, "top_k": top_k}


def _linear(ctx, fan_in, fan_out):
    """An nn.Linear with N(0, 1/fan_in) weights and N(0, 0.1^2) biases of this rank's own."""
    lin = torch.nn.utils.skip_init(torch.nn.Linear, fan_in, fan_out, device=ctx.device, dtype=ctx.dtype)
    lin.requires_grad_(False)
    lin.weight.copy_(ctx.randn(fan_out, fan_in, scale=fan_in**-0.5))
    lin.bias.copy_(ctx.randn(fan_out, scale=0.1))
    return lin


def routed_tokens(ctx, gate_weight, gate_bias, experts, ep_size, ep_rank):
    """bf16 [T, H] tokens whose router logits are drawn targets (module docstring, "Inputs")."""
    s = ctx.size
    tokens, hidden, top_k = s["tokens"], s["hidden"], s["top_k"]
    if ctx.is_meta:
        return ctx.randn(tokens, hidden)
    local = experts // ep_size
    uses_own = torch.zeros(tokens, dtype=torch.bool, device=ctx.device)
    uses_own[ctx.rand(tokens, dtype=torch.float32).argsort()[: tokens * top_k // ep_size]] = True
    owner_score = ctx.rand(tokens, ep_size, dtype=torch.float32)
    owner_score[:, ep_rank] = torch.where(uses_own, 2.0, -1.0)
    owners = owner_score.topk(top_k, dim=-1).indices  # distinct ranks of the token's experts
    chosen = owners * local + ctx.randint(0, local, tokens, top_k).to(owners.device)
    target = ctx.rand(tokens, experts, low=-1.0, high=0.0, dtype=torch.float64)
    target.scatter_(1, chosen, ctx.rand(tokens, top_k, low=2.0, high=3.0, dtype=torch.float64))
    w = gate_weight.double()
    noise = ctx.randn(tokens, hidden, dtype=torch.float64)
    excess = noise @ w.T + gate_bias.double() - target  # [T, E]
    return (noise - torch.linalg.solve(w @ w.T, excess.T).T @ w).to(ctx.dtype)


def make_inputs(ctx):
    """Router shared by all ranks; tokens that follow a drawn routing; this rank's expert MLP."""
    s = ctx.size
    hidden, inter = s["hidden"], s["inter"]
    experts = num_experts(ctx.world_size)
    gate_weight = ctx.randn(experts, hidden, shared=True, scale=hidden**-0.5)
    gate_bias = ctx.randn(experts, shared=True, scale=0.5)
    tokens = routed_tokens(ctx, gate_weight, gate_bias, experts, ctx.world_size, ctx.rank)
    mlp = (_linear(ctx, hidden, inter), _linear(ctx, hidden, inter), _linear(ctx, inter, hidden))
    return (tokens, gate_weight, gate_bias, *mlp, experts, s["top_k"], None)


def solution(
    hidden_states, gate_weight, gate_bias, gate_proj, up_proj, down_proj, num_experts, top_k, group=None
):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    hidden = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden)
    probs, chosen = torch.softmax(F.linear(x, gate_weight, gate_bias), dim=-1).topk(top_k, dim=-1)
    flat = chosen.reshape(-1)
    order = flat.argsort(stable=True)  # (token, choice) pairs grouped by expert, so by rank
    token = order // top_k
    counts = torch.bincount(flat, minlength=num_experts)
    every = counts.new_empty(w * num_experts)
    _all_gather(every, counts, group=group)
    pairs = every.view(w, w, num_experts // w).sum(dim=2).cpu()  # [p, q]: tokens p sends q; one sync
    send, receive = pairs[rank].tolist(), pairs[:, rank].tolist()
    dispatched = x.new_empty(sum(receive), hidden)
    dist.all_to_all_single(dispatched, x.index_select(0, token), receive, send, group=group)
    y = down_proj(F.silu(gate_proj(dispatched)) * up_proj(dispatched))
    back = x.new_empty(flat.numel(), hidden)
    dist.all_to_all_single(back, y, send, receive, group=group)
    weighted = back.float() * probs.reshape(-1).index_select(0, order).float().unsqueeze(1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, token, weighted)
    return out.to(hidden_states.dtype)


def traffic(ctx):
    """Per GPU, the least over two schedules; memory and FLOPs the least any schedule needs.

    Tokens to experts: rank r sends its T k - T k / W remote (token, expert) pairs and receives each
    one's output back; what it receives for its own expert and sends back averages the same over the
    ranks, so the slowest rank moves at least 2 (T k - T k / W) H elements each way.
    Weights to tokens: each rank fetches the W - 1 other experts' MLPs (3 H I + 2 I + H elements
    each) and runs every expert on its own tokens: no token moves. Memory: read the tokens, the
    router and the MLP, write the output. FLOPs: the router and T k MLP passes of 6 H I.
    """
    s, w = ctx.size, ctx.world_size
    return _traffic(s, num_experts(w), w, ctx.dtype.itemsize)


def _traffic(s, experts, ep_size, itemsize):
    tokens, hidden, inter, top_k = s["tokens"], s["hidden"], s["inter"], s["top_k"]
    remote_pairs = tokens * top_k - tokens * top_k // ep_size
    mlp = 3 * hidden * inter + 2 * inter + hidden
    return {
        "nvlink_bytes": min(2 * remote_pairs * hidden, (ep_size - 1) * mlp) * itemsize,
        "hbm_bytes": (2 * tokens * hidden + experts * (hidden + 1) + mlp) * itemsize,
        "flops": 2 * tokens * hidden * experts + tokens * top_k * 6 * hidden * inter,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(hidden_states: torch.Tensor, gate_weight: torch.Tensor, gate_bias: Optional[torch.Tensor], "
        "gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear, num_experts: int, "
        "top_k: int, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "the router is the same on every rank and the tokens are drawn so that its choices have a clear "
        "margin (the original draws a router per rank and plain N(0, 1) tokens, whose bf16 logits tie or "
        "nearly tie); the linear modules' parameters do not require gradients; the reference sums each "
        "token's expert outputs in float32 (the original in bf16), within the tolerance."
    ),
}
