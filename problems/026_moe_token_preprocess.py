"""Expert-parallel dispatch preprocessing: who sends how many tokens to whom, from the routing mask.

Under expert parallelism (EP) the E experts are split evenly over the W ranks: rank r owns experts
r*E/W .. (r+1)*E/W - 1 (its local experts). Every rank holds the routing of its own tokens as a
one-hot mask, expert_mask float32 [E, top_k, tokens] (expert_mask[e, j, t] = 1 when token t's j-th
choice is expert e; each token picks top_k distinct experts). Before the token all-to-all, every rank
needs the split sizes and the per-expert counts. With c_p[e] the number of tokens rank p routes to
expert e (the mask summed over top_k and tokens), rank r must return

  input_splits   int64 [W]            tokens r sends to each rank q: sum of c_r over q's experts
  output_splits  int64 [W]            tokens r receives from each rank p: sum of c_p over r's experts
  per_rank       float32 [W, E/W]     c_p[e] for every rank p and each of r's local experts e
  per_expert     float32 [E/W]        the sum of per_rank over the ranks: r's experts' global loads

The reference sums the mask, all-gathers the W count vectors (one collective) and takes its slices.

Source: VeOmni's / Megatron-LM's MoE all-to-all dispatcher `preprocess` (ParallelKernelBench problem
26). The signature and the call (expert_mask, num_experts, None) are the original's; group None is the
default (world) group. Each rank's router prefers its own random experts, so the counts differ by
rank, expert and trial.

Differences from the original: the original returns its outputs as host tensors (and ints), moved
off the GPU inside the timed call. Here all four outputs are tensors on the rank's device, so they
can be judged and no solution pays for a device-to-host copy. An original file that returns host
tensors is still judged correctly (values, dtypes and shapes are compared, not devices) and passes
on CPU; one that returns Python ints or lists where tensors are expected fails ("output 0: expected
tensor, got a tuple or list of 2").
"""

import torch
import torch.distributed as dist

ID = 26
NAME = "moe_token_preprocess"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM MoE all-to-all token dispatcher (preprocess)"
SUMMARY = "From a float32 one-hot routing mask [E, k, T]: EP split sizes and per-expert token counts."
DTYPE = "float32"
WORLD_SIZES = "world size >= 2 dividing experts (8 at the pkb size)"
SIZES = {
    # experts: E; top_k: choices per token; tokens: this rank's tokens
    "pkb": {"experts": 8, "top_k": 2, "tokens": 1024},
    # DeepSeek-V3's routing (256 experts, top-8) over 512K tokens: a 4 GiB mask per rank, whose
    # reduction takes about 1.2 ms at an H200's HBM bandwidth (an estimate until measured)
    "large": {"experts": 256, "top_k": 8, "tokens": 1 << 19},
}
# Why the exchange cannot be a material part of the floor (docs/problem-format.md, MINOR_EXCHANGE;
# figures at the datasheet's ceilings, bench/scripts/comm_share.py)
MINOR_EXCHANGE = (
    "the exchange is each peer's counts for this rank's E / W experts, (W - 1) x E / W float32 values "
    "(768 bytes at `large`, W = 4), against the E x top_k x tokens float32 mask read: the bytes are "
    "nothing and the one round's 5 us is 0.5% of a 1 ms floor"
)
# Counts of 0/1 values: sums in float32 are exact (every count is below 2^24), so every correct
# solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["experts"] % world_size:
        return f"experts = {size['experts']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): experts in multiples
    of W (the rule), top_k below experts, tokens in multiples of 8."""
    experts = draw("experts", world_size, 32, world_size)
    return {
        "experts": experts,
        "top_k": draw("top_k", 1, min(6, experts - 1)),
        "tokens": draw("tokens", 128, 1536, 8),
    }


def make_inputs(ctx):
    """Each token's top_k experts by random scores plus a per-rank random preference per expert.

    The preference's standard deviation is 1, so some experts get several times their fair share
    on one rank and few tokens on another.
    """
    experts, top_k, tokens = ctx.size["experts"], ctx.size["top_k"], ctx.size["tokens"]
    preference = ctx.randn(experts, dtype=torch.float32)
    scores = ctx.randn(tokens, experts, dtype=torch.float32) + preference
    chosen = scores.topk(top_k, dim=-1).indices  # [tokens, top_k], distinct experts per token
    mask = torch.zeros(experts, top_k, tokens, dtype=torch.float32, device=scores.device)
    mask.scatter_(0, chosen.T.unsqueeze(0), 1.0)
    return mask, experts, None


def solution(expert_mask, num_experts, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    local = num_experts // w
    counts = expert_mask.sum(dim=(1, 2))  # [E]: this rank's tokens per expert
    gathered = counts.new_empty(w * num_experts)
    _all_gather(gathered, counts, group=group)
    per_rank = gathered.view(w, num_experts)[:, rank * local : (rank + 1) * local].contiguous()
    input_splits = counts.view(w, local).sum(dim=1).to(torch.int64)
    output_splits = per_rank.sum(dim=1).to(torch.int64)
    return input_splits, output_splits, per_rank, per_rank.sum(dim=0)


def traffic(ctx):
    """Per GPU: each peer's counts for this rank's E/W experts, 4 bytes each, in one round.

    All-gathering every count, as the reference does, moves (W-1) x E values; a solution needs only
    the E/W counts each peer has for its experts, and every other output is derived from those and
    its own counts. Memory: read the mask once (it must all be read: any element may be a 1).
    """
    w = ctx.world_size
    experts, top_k, tokens = ctx.size["experts"], ctx.size["top_k"], ctx.size["tokens"]
    mask_elems = experts * top_k * tokens
    return {
        "nvlink_bytes": (w - 1) * (experts // w) * 4,
        "hbm_bytes": mask_elems * 4,
        "flops": mask_elems,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(expert_mask, num_experts, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the original returns its outputs as host tensors (and ints), moved off the GPU inside the timed "
        "call. Here all four outputs are tensors on the rank's device, so they can be judged and no "
        "solution pays for a device-to-host copy. An original file that returns host tensors is still "
        "judged correctly (values, dtypes and shapes are compared, not devices) and passes on CPU; one "
        'that returns Python ints or lists where tensors are expected fails ("output 0: expected tensor, '
        'got a tuple or list of 2").'
    ),
}
