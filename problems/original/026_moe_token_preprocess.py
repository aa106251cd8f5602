"""The original benchmark's problem 26, exactly: the split sizes and token counts before the MoE dispatch.

As the original's input builder makes them (a seed per rank): each of rank r's 1024 tokens draws 2
experts of 8 uniformly at random (the two may be the same), and rank r holds their one-hot mask as
the original builds it, float32 [8, 2, 1024] (a permuted view of a [1024, 2, 8] tensor), and is
called as solution(expert_mask, 8, None). The 8 experts are split evenly over the W ranks (rank q
owns experts q * 8/W .. (q + 1) * 8/W - 1); with c_p[e] the number of rank p's choices of expert e,
every rank all-gathers the count vectors and returns, as host tensors, as the original does:

  input_splits   int64 [W]          choices rank r sends to each rank q: c_r summed over q's experts
  output_splits  int64 [W]          choices rank r receives from each rank p: c_p over r's experts
  per_rank       float32 [W, 8/W]   c_p[e] for every rank p and each of r's experts e
  per_expert     float32 [8/W]      per_rank summed over the ranks

Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the routing is drawn from
secret seeds (pkb's, docs/variants.md).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 26
NAME = "moe_token_preprocess"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM MoE all-to-all token dispatcher (preprocess)"
SUMMARY = (
    "From a float32 one-hot routing mask [8, 2, 1024]: EP split sizes and token counts (the original's)."
)
DTYPE = "float32"
WORLD_SIZES = "world size >= 2 dividing experts (8)"
SIZES = {"pkb": {"experts": 8, "top_k": 2, "tokens": 1024}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["experts"] % world_size:
        return f"experts = {size['experts']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: top_k uniform expert choices per token, one-hot, permuted to [E, top_k, T]."""
    s = ctx.size
    chosen = ctx.randint(0, s["experts"], s["tokens"], s["top_k"])
    if ctx.is_meta:
        mask = torch.empty(s["tokens"], s["top_k"], s["experts"], dtype=torch.float32, device="meta")
    else:
        mask = F.one_hot(chosen, s["experts"]).float()
    return mask.permute(2, 1, 0), s["experts"], None


def solution(expert_mask, num_experts, group=None):
    group = group or dist.group.WORLD
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    local = num_experts // w
    counts = expert_mask.sum(dim=(1, 2))  # float32 [E]: this rank's choices of each expert
    input_splits = counts.view(w, local).sum(dim=1)
    every = counts.new_empty(w * num_experts)  # flat: gloo gathers only into a [W * E] buffer
    _all_gather(every, counts, group=group)
    per_rank = every.view(w, num_experts)[:, rank * local : (rank + 1) * local]
    host = torch.device("cpu")
    return (
        input_splits.to(host, torch.int64),
        per_rank.sum(dim=1).to(host, torch.int64),
        per_rank.to(host, copy=True),
        per_rank.sum(dim=0).to(host),
    )


def traffic(ctx):
    """Per GPU, the least: each peer's counts of this rank's 8/W experts, 4 bytes each, one round;
    the mask read once."""
    s, w = ctx.size, ctx.world_size
    mask_elems = s["experts"] * s["top_k"] * s["tokens"]
    return {
        "nvlink_bytes": (w - 1) * (s["experts"] // w) * 4,
        "hbm_bytes": mask_elems * 4,
        "flops": mask_elems,
        "rounds": 1,
    }
