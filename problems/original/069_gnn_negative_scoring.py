"""The original benchmark's problem 69, exactly: each positive edge's rank among its negatives, everywhere.

As the original's input builder makes them (random normal bf16, a seed per rank): rank r holds
local_pos_scores [P_r] and local_neg_scores [P_r, 1000], P_r = max(16, min(1024 / W, 1280)) + r % 3
(512 + r % 3 at W = 2, 256 + r % 3 at W = 4), and is called as
solution(local_pos_scores, local_neg_scores, None). Every rank returns the ranks of every rank's
positive edges, int64 [P_0 + ... + P_{W-1}], rank 0's first: a positive's rank is its place (from 1)
among its own and its negatives' scores after torch.sigmoid in bf16 and torch.sort (descending, not
stable), as the original ranks it. Judged as the original harness judges: atol = rtol = 1e-2, no norm
bound (pkb's judge compares integer outputs exactly, where the original's compares them as floats
within 1%); the inputs are drawn from secret seeds (pkb's, docs/variants.md).

What the original leaves to the sort: bf16's sigmoid merges neighbouring logits, so a positive ties
with some of its negatives on most edges, and where it lands among them is the sort's choice, not
the workload's: torch's CPU sort places it neither first nor last among them. Ranks counted as 1 +
the negatives scored higher differ from the sort's on 61% of the edges at W = 2 (one seed on CPU),
by more than the original's 1% on 21% of them (up to 20% of the rank). So the answer is torch.sort's
on the device that runs it; a solution that ranks otherwise fails here, and would fail the
original's own harness too.
"""

import math

import torch
import torch.distributed as dist

ID = 69
NAME = "gnn_negative_scoring"
CATEGORY = "GNN"
SOURCE = "GNN link-prediction evaluation (OGB ranking protocol)"
SUMMARY = (
    "Rank each positive bf16 score among 1000 negatives by bf16 sigmoid; gather all ranks (the original's)."
)
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
# m: the original harness's M, of which each rank's positives are a share
SIZES = {"pkb": {"m": 1024, "negatives": 1000}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def positives(rank, world_size, size):
    """The original's P_r."""
    return max(16, min(size["m"] // world_size, 1280)) + rank % 3


def make_inputs(ctx):
    """The original's: P_r positive logits and P_r x 1000 negative logits, standard normal; group None."""
    p = positives(ctx.rank, ctx.world_size, ctx.size)
    return ctx.randn(p), ctx.randn(p, ctx.size["negatives"]), None


@torch.no_grad()
def solution(local_pos_scores, local_neg_scores, group=None):
    w = dist.get_world_size(group)
    # the original's ranking, sort and all: its tie order is part of the answer (see the docstring)
    probs = torch.sigmoid(torch.cat([local_pos_scores.view(-1, 1), local_neg_scores], dim=1))
    order = torch.sort(probs, dim=1, descending=True).indices
    ranks = (order == 0).nonzero()[:, 1].add_(1)
    counts = torch.empty(w, dtype=torch.int64, device=ranks.device)
    dist.all_gather_into_tensor(counts, torch.tensor([ranks.numel()], device=ranks.device), group=group)
    sizes = counts.tolist()
    longest = max(sizes)
    padded = ranks.new_zeros(longest)
    padded[: ranks.numel()] = ranks
    gathered = ranks.new_empty(w * longest)
    dist.all_gather_into_tensor(gathered, padded, group=group)
    return torch.cat([gathered[i * longest : i * longest + n] for i, n in enumerate(sizes)])


def traffic(ctx):
    """Per GPU, the least: its ranks (2 bytes each: a rank is at most 1001) to every peer in one step;
    the largest P_r sets the figure (the original sends every score instead, 1000 times more).
    HBM: the scores read once, the gathered int64 ranks written."""
    w, s = ctx.world_size, ctx.size
    k = s["negatives"]
    p_max = max(positives(r, w, s) for r in range(w))
    total = sum(positives(r, w, s) for r in range(w))
    return {
        "nvlink_bytes": (w - 1) * p_max * 2,
        "hbm_bytes": p_max * (k + 1) * ctx.dtype.itemsize + total * 8,
        "flops": p_max * (k + 1) * 5,  # a sigmoid and a compare per score
        "rounds": 1,
    }
