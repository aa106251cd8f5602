"""The expert-parallel all-to-all with uneven split sizes (all-to-all-v), as a MoE dispatch calls it.

Each rank r holds local_tensor [T, H] (bf16): its tokens, already sorted by destination rank, and two
lists of W Python ints: input_split_sizes (how many rows go to each rank q, in rank order; they sum to
T) and output_split_sizes (how many rows arrive from each rank p: p's input_split_sizes[r]). Every
rank returns [sum(output_split_sizes), H] (bf16): the rows each rank p sent it, p = 0 first. Pure data
movement: judged bit for bit.

The split sizes are random, new each trial, and the same matrix on every rank (S[p][q]: rows rank p
sends rank q): a rank keeps T // W of its rows and sends the rest to its W - 1 peers in random
proportions (log-normal weights of standard deviation 0.5, at least one row per peer), as a router's
uneven loads make them. So every rank sends the same number of rows across the links and receives a
number of its own. The rows are random per rank and trial, so a rank that skips the exchange returns
the wrong rows.

Source: VeOmni's / Megatron-LM's EP all-to-all primitive (`all_to_all` with split sizes,
ParallelKernelBench problem 27). The signature and the call (local_tensor, input_split_sizes,
output_split_sizes, None) are the original's: the splits are lists, so no solution needs a
device-to-host sync to read them (the original's tensor form, `.sum().item()`, is not called).

Differences from the original: the split sizes. The original's builder splits the 1024 rows evenly
(1024 // W each, the remainder to the last rank) and passes the same list as both input and output
splits, an even all-to-all that is only consistent where W divides 1024; here they are uneven and
random per trial, and any world size works.
"""

import torch
import torch.distributed as dist

ID = 27
NAME = "moe_all2all_primitive"
CATEGORY = "EP"
SOURCE = "VeOmni / Megatron-LM EP all-to-all primitive (all_to_all_single with split sizes)"
SUMMARY = "All-to-all-v of bf16 token rows [T, H] with uneven, random split-size lists."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 with at least one row per peer"
SIZES = {
    # tokens: T, rows of each rank's local_tensor; hidden: H
    "pkb": {"tokens": 1024, "hidden": 1024},
    # DeepSeek-V3's dispatch (hidden 7168) of 8192 tokens x top-8 = 65536 rows a rank: 0.94 GB, of which
    # a half crosses the links at W = 2 (about 1.2 ms at 395 GB/s) and 3/4 at W = 4 (an estimate until
    # measured)
    "large": {"tokens": 65536, "hidden": 7168},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["tokens"] - size["tokens"] // world_size < world_size - 1:
        return f"tokens = {size['tokens']} leaves a peer no row at world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): tokens in multiples
    of 8 (the splits stay random), hidden in multiples of 64."""
    return {"tokens": draw("tokens", 128, 1536, 8), "hidden": draw("hidden", 256, 1536, 64)}


def split_matrix(ctx):
    """S[p][q], rows rank p sends rank q: T // W kept (q = p), the rest over the peers by random
    log-normal weights, each peer at least one row; the same on every rank (even on `meta`)."""
    w, t = ctx.world_size, ctx.size["tokens"]
    keep, rest = t // w, t - t // w
    if ctx.is_meta:  # one fixed draw of the same law: what `pkb show` prints, uneven as a trial's
        example = torch.Generator().manual_seed(27)
        weights = torch.randn(w, w, generator=example, dtype=torch.float64).mul(0.5).exp()
    else:
        weights = ctx.randn(w, w, dtype=torch.float64, shared=True).mul(0.5).exp().cpu()
    rows = []
    for p in range(w):
        peers = [q for q in range(w) if q != p]
        share = weights[p, peers] / weights[p, peers].sum() * (rest - len(peers))
        counts = [1 + int(x) for x in share.tolist()]
        for i in range(rest - sum(counts)):  # the rows lost to rounding down, one each
            counts[i % len(counts)] += 1
        rows.append([*counts[:p], keep, *counts[p:]])
    return rows


def make_inputs(ctx):
    """Random rows; this rank's row and column of the split matrix (see split_matrix)."""
    s = split_matrix(ctx)
    r = ctx.rank
    return ctx.randn(ctx.size["tokens"], ctx.size["hidden"]), s[r], [row[r] for row in s], None


def solution(local_tensor, input_split_sizes=None, output_split_sizes=None, group=None):
    output = local_tensor.new_empty(sum(output_split_sizes), local_tensor.shape[1])
    dist.all_to_all_single(
        output,
        local_tensor,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    return output


def traffic(ctx):
    """Per GPU: the rows for the W - 1 peers leave once, T - T // W rows of H; the kept ones do not.

    Every rank sends exactly that many (the split matrix keeps T // W rows on each), and no schedule
    moves less: the rows are random and exist only on their sender. The most any rank receives is at
    least the mean, the same figure, so the floor holds for the slowest rank too. HBM: read the rows,
    write as many (each rank receives T on average).
    """
    t, h, w = ctx.size["tokens"], ctx.size["hidden"], ctx.world_size
    row = h * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (t - t // w) * row,
        "hbm_bytes": 2 * t * row,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem takes
# the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(local_tensor: torch.Tensor, input_split_sizes: Optional[Union[List[int], torch.Tensor]] = "
        "None, output_split_sizes: Optional[Union[List[int], torch.Tensor]] = None, group: "
        "Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "the split sizes are uneven and random per trial (the original splits the rows evenly and passes "
        "one list as both input and output splits), so any world size works. An original file passes "
        "unchanged."
    ),
}
