"""A SwiGLU MLP under 2-D parallelism: FSDP-sharded weights all-gathered, tensor-parallel GEMMs.

The ranks form an n_fsdp x n_tp mesh with n_tp = 2 and n_fsdp = W/2, TP innermost: rank r has TP
index t = r % 2 and FSDP index f = r // 2. The TP groups are the rank pairs {2f, 2f + 1}; the FSDP
groups are {t, t + 2, t + 4, ...}.

The MLP is y = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T with nn.Linear weights
w_gate, w_up [ffn, dim] and w_down [dim, ffn]. Tensor parallelism (Megatron-style) splits ffn:
TP rank t owns rows t*ffn/2 .. of w_gate and w_up (column-parallel) and the same columns of w_down
(row-parallel), ffn_tp = ffn/2 of them. FSDP (FSDP2-style, dim 0) then splits each TP-local weight
into n_fsdp row blocks, one per rank of the FSDP group: rank r holds
  x          [tokens, dim]               the activations of its FSDP group's batch (the two ranks
                                          of a TP group hold the same x; FSDP groups differ)
  gate_shard [ffn_tp / n_fsdp, dim]      block f of its TP-local w_gate
  up_shard   [ffn_tp / n_fsdp, dim]      block f of its TP-local w_up
  down_shard [dim / n_fsdp, ffn_tp]      block f of its TP-local w_down
all bf16. Every rank must all-gather its three TP-local weights over the FSDP group, compute its
partial output with them and sum the partials over the TP group, returning y bf16 [tokens, dim]
(the same on both ranks of a TP group). The reference does three all-gathers, three bf16 GEMMs
(float32 accumulation) with h rounded to bf16, and an all-reduce of the bf16 partials.

The TP and FSDP process groups are created once per process, on the first call, and cached
(dist.new_group is collective: every rank creates every group, in the same order). A solution may
do the same: the first call, which is judged, pays for the creation; the timed calls do not.

Source: PyTorch FSDP2 x tensor-parallel MLP (ParallelKernelBench problem 48). The original creates
six process groups on every call, which dominates its time; here the groups are made once. The
sizes are global (tokens, dim, ffn); at W = 8 the per-rank shards have the original's element
counts (x [512, 256], weight shards of 32768 elements), and the weights are in nn.Linear layout,
sharded along dim 0 as FSDP2 does. Weights are scaled so that y is O(1).
"""

import torch.distributed as dist
import torch.nn.functional as F

ID = 48
NAME = "fsdp_and_tp"
CATEGORY = "FSDP+TP"
SOURCE = "PyTorch FSDP2 + tensor parallelism (2-D mesh), SwiGLU MLP"
SUMMARY = "SwiGLU MLP: all-gather FSDP weight shards, TP GEMMs, all-reduce over the TP pair: [tokens, dim]."
DTYPE = "bfloat16"
WORLD_SIZES = "even world size >= 4 (n_tp = 2, n_fsdp = W/2) with W dividing ffn and W/2 dividing dim"
SIZES = {
    # tokens: rows of x; dim: model width; ffn: the MLP's full hidden width (split over TP, then FSDP)
    "pkb": {"tokens": 512, "dim": 256, "ffn": 1024},
    "large": {"tokens": 8192, "dim": 4096, "ffn": 14336},
}
N_TP = 2
# y is O(1) (RMS ~1.2, max ~6). Correct solutions differ in float32 accumulation order, in whether
# h = silu(g) * u is rounded to bf16 before the last GEMM and in whether the TP partials are summed
# in bf16 or float32. Measured on CPU: an all-float32 solution differs from the reference by a
# relative norm of 0.0046 (the reference's own error against float64 is 0.0043), and its worst
# element over 8M outputs comes within 0.006 of atol = rtol = 0.03; hence the margin below.
TOLERANCE = {"atol": 0.05, "rtol": 0.03, "rel_norm": 0.015}

_GROUPS = {}  # world size -> (TP group, FSDP group) of this rank

# torch 2.13 renamed all_gather_into_tensor to all_gather_single; both run the same collective.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 4 or world_size % N_TP:
        return "needs an even world size >= 4 (n_tp = 2 by n_fsdp = W/2 >= 2)"
    if size["ffn"] % world_size:
        return f"ffn = {size['ffn']} is not divisible by the world size {world_size} (n_tp * n_fsdp)"
    if size["dim"] % (world_size // N_TP):
        return f"dim = {size['dim']} is not divisible by n_fsdp = {world_size // N_TP}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any tokens of 8s, dim
    a multiple of 32 n_fsdp and ffn of 32 W (whole 32-row FSDP blocks), GEMM work at most 1.5x pkb's."""
    n_fsdp = max(1, world_size // N_TP)
    dim = draw("dim", 128, 384, 32 * n_fsdp)
    ffn = draw("ffn", 512, 1536, 32 * world_size)
    return {"tokens": draw("tokens", 64, max(64, 3 * 2**27 // (dim * ffn)), 8), "dim": dim, "ffn": ffn}


def make_inputs(ctx):
    """x shared within a TP pair (drawn for all FSDP groups from the shared stream), shards per rank.

    x ~ N(0, 1); w_gate, w_up ~ N(0, 1/dim) so the pre-activations are N(0, 1); w_down ~
    N(0, 4/ffn) so y has an RMS of about 1.
    """
    tokens, dim, ffn = ctx.size["tokens"], ctx.size["dim"], ctx.size["ffn"]
    n_fsdp = ctx.world_size // N_TP
    ffn_tp = ffn // N_TP
    f = ctx.rank // N_TP
    x = ctx.randn(n_fsdp, tokens, dim, shared=True)[f].clone()
    gate_shard = ctx.randn(ffn_tp // n_fsdp, dim, scale=dim**-0.5)
    up_shard = ctx.randn(ffn_tp // n_fsdp, dim, scale=dim**-0.5)
    down_shard = ctx.randn(dim // n_fsdp, ffn_tp, scale=2 * ffn**-0.5)
    return x, gate_shard, up_shard, down_shard


def _groups():
    """This rank's (TP group, FSDP group), created on the first call and cached."""
    w = dist.get_world_size()
    if w not in _GROUPS:
        n_fsdp = w // N_TP
        rank = dist.get_rank()
        tp_group = fsdp_group = None
        for f in range(n_fsdp):
            g = dist.new_group([f * N_TP + t for t in range(N_TP)])
            if rank // N_TP == f:
                tp_group = g
        for t in range(N_TP):
            g = dist.new_group([f * N_TP + t for f in range(n_fsdp)])
            if rank % N_TP == t:
                fsdp_group = g
        _GROUPS[w] = (tp_group, fsdp_group)
    return _GROUPS[w]


def _gather(shard, group, n):
    full = shard.new_empty(n * shard.shape[0], shard.shape[1])
    _all_gather(full, shard, group=group)
    return full


def solution(x, gate_shard, up_shard, down_shard):
    tp_group, fsdp_group = _groups()
    n_fsdp = dist.get_world_size() // N_TP
    w_gate = _gather(gate_shard, fsdp_group, n_fsdp)
    w_up = _gather(up_shard, fsdp_group, n_fsdp)
    w_down = _gather(down_shard, fsdp_group, n_fsdp)
    h = F.silu(x @ w_gate.T) * (x @ w_up.T)
    y = h @ w_down.T
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=tp_group)
    return y


def traffic(ctx):
    """Per GPU: the FSDP all-gathers of three weights, then the TP all-reduce of the partial output.

    All-gather: a rank receives the n_fsdp - 1 foreign blocks of each TP-local weight (and sends its
    own block to as many peers), in one step. All-reduce over a TP pair: each rank must send the
    half of its partial that its partner reduces (or all of it, one-shot); 2(n-1)/n = 1 partial
    either way, in one more step.
    """
    w = ctx.world_size
    tokens, dim, ffn = ctx.size["tokens"], ctx.size["dim"], ctx.size["ffn"]
    n_fsdp = w // N_TP
    ffn_tp = ffn // N_TP
    isz = ctx.dtype.itemsize
    weights = 3 * ffn_tp * dim  # the three TP-local weights, gathered
    return {
        "nvlink_bytes": (n_fsdp - 1) / n_fsdp * weights * isz + 2 * (N_TP - 1) / N_TP * tokens * dim * isz,
        # read x; land the gathered weights and read them once; write the output. h stays on chip
        # in a fused kernel.
        "hbm_bytes": (tokens * dim + 2 * weights + tokens * dim) * isz,
        "flops": 3 * 2 * tokens * dim * ffn_tp + 4 * tokens * ffn_tp + tokens * dim,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py).
ORIGINAL = {
    "signature": (
        "solution(x_local: Tensor, W1_shard: Tensor, W2_shard: Tensor, W3_shard: Tensor, n_tp: int, "
        "n_fsdp: int) -> Tensor"
    ),
    "args": None,
    "differences": (
        "The original creates six process groups on every call and its shards are W1, W2 [64, 512] and "
        "W3 [512, 64] at 8 ranks; here gate and up are [ffn / (2 n_fsdp), dim] and down "
        "[dim / n_fsdp, ffn / 2] (nn.Linear layout, FSDP-sharded by rows), so the original's shards have "
        "no counterpart in these inputs."
    ),
}
