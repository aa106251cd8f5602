"""Ulysses all-gather of tensors whose size along the gathered dimension differs from rank to rank.

Every rank holds a bf16 tensor x; along `gather_dim` its length n_r is its own (here a random number of
rows), the other dimensions are the same on every rank. Every rank must return the W tensors
concatenated along gather_dim in rank order. With the original's call (x, 0, None), x is [n_r, cols]
and the output is [n_0 + ... + n_(W-1), cols]: rows n_0 + ... + n_(r-1) onwards are rank r's x.

No rank knows the others' lengths in advance: the reference all-gathers them first (one int64 each),
then pads its x to the longest length, all-gathers the padded tensors into one buffer and
concatenates the valid parts (the pattern of VeOmni's variable-size all-gather, two all-gathers).

Source: VeOmni's Ulysses `all_gather_variable` primitive (ParallelKernelBench problem 35). The
signature and the call (x, 0, None) are the original's; group None is the default (world) group.

Differences from the original: the original gives every rank the same [1024, 1024], which makes the
primitive the same as problem 34's. Here each rank's row count is random in [7/8 rows, rows], drawn
anew on every rank in every trial, so a solution must exchange the lengths; `rows` is the largest a
rank can hold, and the shapes `pkb show` lists are that largest case.
"""

import torch
import torch.distributed as dist

ID = 35
NAME = "ulysses_all_gather_variable_primitive"
CATEGORY = "SP"
SOURCE = "VeOmni Ulysses sequence parallelism (all_gather_variable)"
SUMMARY = "All-gather bf16 x [n_r, cols] with a different n_r on every rank -> [sum of n_r, cols]."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    # rows: the most rows a rank holds (each holds a random number in [7/8 rows, rows]); cols: width
    "pkb": {"rows": 1024, "cols": 1024},
    # up to 512 MiB per rank, received from the one peer at W = 2: about 1.3 ms at 395 GB/s (an
    # estimate until measured)
    "large": {"rows": 16384, "cols": 16384},
}
# Pure data movement: every correct solution returns the same bits.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def fewest_rows(size):
    """The least number of rows a rank draws (the traffic model's lower bound)."""
    return size["rows"] - size["rows"] // 8


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): the most rows a rank
    holds in multiples of 8 (each still draws its own count below), columns in multiples of 16."""
    return {"rows": draw("rows", 64, 1536, 8), "cols": draw("cols", 64, 1536, 16)}


def make_inputs(ctx):
    """x [n_r, cols] standard normal, n_r uniform in [7/8 rows, rows] per rank and trial.

    On the meta device (shapes only) n_r is the largest case, rows.
    """
    rows, cols = ctx.size["rows"], ctx.size["cols"]
    drawn = ctx.randint(fewest_rows(ctx.size), rows + 1, 1)
    n = rows if ctx.is_meta else int(drawn.item())
    return ctx.randn(n, cols), 0, None


def solution(x, gather_dim, group=None):
    w = dist.get_world_size(group)
    g = gather_dim % x.dim()
    local = x.movedim(g, 0)  # the gathered dimension first: a view
    n = local.shape[0]
    lengths = torch.empty(w, dtype=torch.int64, device=x.device)
    _all_gather(lengths, torch.tensor([n], dtype=torch.int64, device=x.device), group=group)
    sizes = lengths.tolist()  # the output's shape depends on them: the host must know them
    longest = max(sizes)
    if n == longest and local.is_contiguous():
        padded = local
    else:
        padded = local.new_empty(longest, *local.shape[1:])
        padded[:n] = local
    gathered = local.new_empty(w * longest, *local.shape[1:])
    _all_gather(gathered, padded, group=group)
    gathered = gathered.unflatten(0, (w, longest))
    if all(s == longest for s in sizes):
        out = gathered.flatten(0, 1)
    else:
        out = torch.cat([gathered[j, :s] for j, s in enumerate(sizes)])
    return out if g == 0 else out.movedim(0, g).contiguous()


def traffic(ctx):
    """Per GPU: its x to each of the W-1 peers (and theirs from them), plus one length each.

    Every schedule delivers each rank's x to W-1 others; padding is not needed (a solution can send
    exactly n_r rows to known offsets once it has the lengths, or write into per-rank slots and
    compact). The lengths can travel with the data, so one round. Rows are random, so the floor takes
    the fewest a rank can hold, 7/8 rows, to stay a lower bound. Memory: read x, write the output.
    """
    w = ctx.world_size
    row_bytes = ctx.size["cols"] * ctx.dtype.itemsize
    n = fewest_rows(ctx.size)
    return {
        "nvlink_bytes": (w - 1) * (n * row_bytes + 8),
        "hbm_bytes": (1 + w) * n * row_bytes,
        "flops": 0,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(x, gather_dim, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the original gives every rank the same [1024, 1024], which makes the primitive the same as "
        "problem 34's. Here each rank's row count is random in [7/8 rows, rows], drawn anew on every rank"
        " in every trial, so a solution must exchange the lengths; `rows` is the largest a rank can hold,"
        " and the shapes `pkb show` lists are that largest case."
    ),
}
