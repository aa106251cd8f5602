"""Kimi Delta Attention over a sequence split across context-parallel ranks, summed over a TP pair.

The ranks form a cp x 2 mesh, TP innermost (Megatron's tp-cp order, as the original builds it): rank r
has TP index t = r % 2 and CP index c = r // 2; the TP groups are the rank pairs {2c, 2c + 1}, the CP
groups {t, t + 2, t + 4, ...}. Each CP group holds one sequence of S = cp * L tokens, rank c of the
group its block c: q, k, g bf16 [B, L, H, K], v bf16 [B, L, H, V], beta bf16 [B, L, H] (a logit);
a_log [H] and dt_bias [H * K] are the same on every rank. Per head, in float32:

  q_t, k_t = L2-normalised q, k, q_t scaled by K**-0.5;  beta_t = sigmoid(beta)
  decay_t = exp(-5 * sigmoid(exp(a_log) * (g_t + dt_bias)))         (one value per key dimension)
  S_t = diag(decay_t) S_{t-1};  u_t = beta_t (v_t - k_t^T S_t);  S_t += k_t u_t^T;  o_t = q_t^T S_t

with S_0 = 0, a [K, V] state per head (KDA: the gated delta rule with a per-channel gate). Each rank
must return its block of o summed over its TP pair: out = o(its CP group's sequence)[block c] +
o(its TP peer's CP group's sequence)[block c], bf16 [B, L, H, V] (the same on both ranks of a pair).
The sum over the pair stands for the row-parallel output projection of tensor parallelism (identity
weights): the two ranks of a pair hold different heads' data.

The TP and CP process groups are created once per process, on the first call, and cached
(dist.new_group is collective: every rank creates every group, in the same order). A solution may do
the same: the first call, which is judged, pays for the creation; the timed calls do not.

Reference: one all-gather over the CP group of every rank's q, k, v, g, beta (packed into one buffer);
the recurrence of all H heads over the first c + 1 blocks only (later tokens cannot reach block c), in
the chunked (WY) form of the delta rule (chunks of 64 steps: S/64 steps of matrix products instead of
S steps of matrix-vector products); one float32 all-reduce of the block's outputs over the TP pair, one
rounding to bf16. The chunked form equals the recurrence in exact arithmetic; in float32 it is within
1e-5 of a float64 step-by-step recurrence on these inputs (tests/test_problems_linear_attention.py).
Within a chunk, keys are scaled by exp(-cumulative log-decay), at most exp(64 * 0.06) here, so the
form loses nothing to overflow.

Inputs: q, k, v standard normal, different on every rank and in every trial; beta N(0, 1). g is drawn
from U(-9, -5), so the per-channel decay lies in 0.94 .. 0.9998 (mean about 0.995): the state keeps
most of the sequence, and the last block's outputs depend on the first block's tokens. a_log from
U(-0.1, 0.1) and dt_bias from U(-0.1, 0.1) (the original's ranges), drawn afresh in every trial, the
same on every rank.

Source: flash-linear-attention's Kimi Delta Attention with context and tensor parallelism
(ParallelKernelBench problem 74). A file written for the original is called with the original's
arguments and the two groups: (q, k, v, g, beta, a_log, dt_bias, cp_group, tp_group).

Differences from the original: the original draws g from N(0, 1), so each step's decay is about 0.08:
the state forgets within a few tokens and context parallelism has nothing to carry (a rank could use
its own block and a halo of a few tokens). Here g is drawn from U(-9, -5) (decay near 1), so every
block depends on all earlier ones. a_log and dt_bias are random per trial instead of fixed linspaces.
Our reference takes no group arguments (solution(q, k, v, g, beta, a_log, dt_bias)): the original's
None groups mean a CP group of the whole world and no TP sum, a different workload, so our call
leaves them out and the groups are the problem's. The reference packs the five all-gathers into one,
computes only the blocks that reach its own, in the chunked form instead of a 64 * cp-step Python
loop, and sums the pair in float32. The original needs an even W >= 4 (TP = 2), and so does this
problem.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 74
NAME = "fla_kimi_delta_attention_cp_tp"
CATEGORY = "CP+TP"
SOURCE = "flash-linear-attention Kimi Delta Attention (context parallelism x tensor parallelism)"
SUMMARY = "Kimi Delta Attention (per-channel gated delta rule) over CP-split sequences, summed over TP pairs."
DTYPE = "bfloat16"
WORLD_SIZES = "even world size >= 4 (TP = 2, CP = W / 2)"
SIZES = {
    # seq_local: tokens per rank; the sequence of a CP group is W / 2 * seq_local tokens
    "pkb": {"batch": 1, "seq_local": 64, "heads": 16, "key_dim": 128, "value_dim": 128},
    # W = 4 (the smallest): the last block of each CP group needs the recurrence over 8192 tokens in
    # 16 heads: 128 chunks in sequence, ~10 kernels each on [16, 64, 128] float32 operands (~6 * 8192 *
    # 16 * 128 * 128 = 13 GFLOP of state products plus as much within chunks, well under 1 ms) and
    # ~128 * 10 launches (~1-2 ms): a few ms on an H200 (an estimate until measured); the all-gather
    # moves 4 x 16 MB per rank, the all-reduce 8 MB (float32)
    "large": {"batch": 1, "seq_local": 4096, "heads": 16, "key_dim": 128, "value_dim": 128},
}
# Outputs are bf16 of RMS ~0.04, max ~0.2 (q is scaled by K**-0.5; the pair's sum of two). A file in
# the original's convention (five all-gathers, the recurrence step by step in float32, a bf16
# all-reduce: tests/candidates/by_problem/074_original_style.py) differs from the float32 sum by at
# most 9.8e-4, relative norm 2.9e-3 (CPU, W = 4, 2 trials): the bf16 all-reduce rounds twice. The
# chunked form alone is within 1e-5 of a float64 recurrence (tests/test_problems_linear_attention.py).
# Computing a block from a zero state (no CP exchange) is off by ~75% in norm on the last block.
TOLERANCE = {"atol": 2e-3, "rtol": 0.02, "rel_norm": 0.01}
CHUNK = 64
N_TP = 2
LOWER_BOUND = -5.0

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_GROUPS = {}  # world size -> (TP group, CP group) of this rank


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 4 or world_size % N_TP:
        return f"needs an even world size >= 4 (TP = 2 and CP >= 2), not {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): a batch of 2, blocks
    in multiples of the 64-token chunk, heads in multiples of 4, head dims in multiples of 32."""
    return {
        "batch": draw("batch", 1, 2),
        "seq_local": draw("seq_local", 64, 192, 64),
        "heads": draw("heads", 4, 12, 4),
        "key_dim": draw("key_dim", 64, 128, 32),
        "value_dim": draw("value_dim", 64, 192, 32),
    }


def make_inputs(ctx):
    """This rank's q, k, v, g, beta [B, L, H, ...] and the shared a_log [H], dt_bias [H * K]."""
    s = ctx.size
    b, n, h, kd, vd = s["batch"], s["seq_local"], s["heads"], s["key_dim"], s["value_dim"]
    q = ctx.randn(b, n, h, kd)
    k = ctx.randn(b, n, h, kd)
    v = ctx.randn(b, n, h, vd)
    g = ctx.rand(b, n, h, kd, low=-9.0, high=-5.0)
    beta = ctx.randn(b, n, h)
    a_log = ctx.rand(h, low=-0.1, high=0.1, shared=True)
    dt_bias = ctx.rand(h * kd, low=-0.1, high=0.1, shared=True)
    return q, k, v, g, beta, a_log, dt_bias


def _groups():
    """This rank's (TP group, CP group), created on the first call and cached."""
    w = dist.get_world_size()
    if w not in _GROUPS:
        cp = w // N_TP
        rank = dist.get_rank()
        tp_group = cp_group = None
        for c in range(cp):
            grp = dist.new_group([c * N_TP + t for t in range(N_TP)])
            if rank // N_TP == c:
                tp_group = grp
        for t in range(N_TP):
            grp = dist.new_group([c * N_TP + t for c in range(cp)])
            if rank % N_TP == t:
                cp_group = grp
        _GROUPS[w] = (tp_group, cp_group)
    return _GROUPS[w]


def chunked_delta_rule(q, k, v, log_decay, beta, chunk=CHUNK):
    """The delta rule with decay, in float32, for n independent heads: q, k [n, S, K] (q already
    scaled), v [n, S, V], log_decay [n, S, 1] or [n, S, K] (<= 0), beta [n, S]; returns [n, S, V].

    Chunked (WY) form: within a chunk of C steps with cumulative log-decay G_t (from the chunk's
    start), the pseudo-values u solve (I + A) u = beta (v - (k e^G) S0) with
    A[t, j] = beta_t (k_t e^G_t) . (k_j e^-G_j) for j < t; outputs are (q e^G) S0 + tril(A_qk) u and
    the state moves to e^G_C S0 + (k e^(G_C - G))^T u."""
    n, seq, kd = k.shape
    vd = v.shape[-1]
    pad = (-seq) % chunk
    if pad:  # padded steps: no decay, k = 0 and beta = 0 leave the state as it is
        q, k, v, log_decay = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_decay))
        beta = F.pad(beta, (0, pad))
    m = (seq + pad) // chunk
    q, k = q.view(n, m, chunk, kd), k.view(n, m, chunk, kd)
    v = v.view(n, m, chunk, vd)
    beta = beta.view(n, m, chunk, 1)
    g = log_decay.reshape(n, m, chunk, -1).cumsum(2)
    q_in = q * g.exp()
    k_in = k * g.exp()
    k_out = k * (-g).exp()
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril_(-1)
    a = (beta * (k_in @ k_out.transpose(-1, -2))).masked_fill_(~strict, 0.0)
    a.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    rhs = torch.cat([beta * v, beta * k_in], dim=-1)
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u_v, u_k = solved[..., :vd], solved[..., vd:]  # u = u_v - u_k S0
    a_qk = (q_in @ k_out.transpose(-1, -2)).masked_fill_(strict.T, 0.0)  # j <= t
    last = g[:, :, -1:]  # [n, m, 1, K or 1]
    k_end = k * (last - g).exp()
    carry = last.exp().transpose(-1, -2)  # [n, m, K or 1, 1]
    state = q.new_zeros(n, kd, vd)
    out = torch.empty(n, m, chunk, vd, dtype=q.dtype, device=q.device)
    for c in range(m):
        u = torch.baddbmm(u_v[:, c], u_k[:, c], state, alpha=-1.0)
        torch.baddbmm(torch.bmm(a_qk[:, c], u), q_in[:, c], state, out=out[:, c])
        state = torch.baddbmm(carry[:, c] * state, k_end[:, c].transpose(1, 2), u)
    return out.view(n, m * chunk, vd)[:, :seq]


def kda_heads(q, k, v, g, beta, a_log, dt_bias):
    """The float32 outputs [B, S, H, V] of Kimi Delta Attention over whole sequences [B, S, H, ...]."""
    b, seq, h, kd = q.shape
    q = F.normalize(q.float(), p=2, dim=-1) * kd**-0.5
    k = F.normalize(k.float(), p=2, dim=-1)
    gate = a_log.float().exp().view(h, 1) * (g.float() + dt_bias.float().view(h, kd))
    log_decay = LOWER_BOUND * torch.sigmoid(gate)

    def heads_first(t):
        return t.transpose(1, 2).reshape(b * h, seq, *t.shape[3:])

    out = chunked_delta_rule(
        heads_first(q),
        heads_first(k),
        heads_first(v.float()),
        heads_first(log_decay),
        heads_first(beta.float().sigmoid()),
    )
    return out.view(b, h, seq, -1).transpose(1, 2)


def solution(q, k, v, g, beta, a_log, dt_bias):
    tp_group, cp_group = _groups()
    cp = dist.get_world_size(cp_group)
    c = dist.get_rank(cp_group)
    b, n, h, kd = q.shape
    vd = v.shape[-1]
    fields = torch.cat([q, k, v, g, beta.unsqueeze(-1)], dim=-1)  # [B, L, H, 3K + V + 1]
    gathered = fields.new_empty(cp * b, *fields.shape[1:])
    _all_gather(gathered, fields, group=cp_group)
    gathered = gathered.view(cp, *fields.shape)
    # blocks 0..c of the sequence, [B, (c + 1) L, H, ...]: later blocks cannot reach block c
    prefix = gathered[: c + 1].transpose(0, 1).reshape(b, (c + 1) * n, h, -1)
    parts = prefix.split([kd, kd, vd, kd, 1], dim=-1)
    out = kda_heads(*parts[:4], parts[4].squeeze(-1), a_log, dt_bias)
    out = out[:, c * n :].contiguous()
    dist.all_reduce(out, group=tp_group)
    return out.to(q.dtype)


def traffic(ctx):
    """Per GPU, each direction: the CP part and the TP part, each the minimum of its schedules.

    CP: the last block needs what every earlier block leaves in the state. Either the earlier blocks'
    inputs come to it (the reference's all-gather: (cp - 1) blocks of q, k, v, g, beta at most), or
    the state does, passed along the CP group after each rank has run its own block from the state it
    received: one [K, V] state per head in bf16 (the least a state can be sent in). TP: a rank needs
    its peer's output block (L H V in bf16; its peer's inputs would be 4x more). Rounds: the TP
    exchange depends on the CP result, 2 (the state chain needs cp). FLOPs: the state products of
    the chunked form, 6 K V per token and head, over the rank's own block (the state schedule); the
    intra-chunk products are not counted (a lower bound). Memory: read the inputs, write the output.
    """
    w, s = ctx.world_size, ctx.size
    b, n, h, kd, vd = s["batch"], s["seq_local"], s["heads"], s["key_dim"], s["value_dim"]
    item = ctx.dtype.itemsize
    cp = w // N_TP
    block = b * n * h * (3 * kd + vd + 1) * item
    output = b * n * h * vd * item
    cp_bytes = min((cp - 1) * block, b * h * kd * vd * 2)
    return {
        "nvlink_bytes": cp_bytes + output,
        "hbm_bytes": block + output,
        "flops": 6 * b * n * h * kd * vd,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): with the two
# groups of the problem's mesh (created once per job).
ORIGINAL = {
    "signature": (
        "solution(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, "
        "a_log: torch.Tensor, dt_bias: torch.Tensor, cp_group: Optional[dist.ProcessGroup] = None, "
        "tp_group: Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "groups": lambda env: dict(zip(("tp", "cp"), _groups(), strict=True)),
    "args": lambda inputs, env: (*inputs, env.groups["cp"], env.groups["tp"]),
    "differences": (
        "g is drawn from U(-9, -5) instead of N(0, 1): the original's per-step decay of ~0.08 forgets "
        "within a few tokens, so context parallelism had nothing to carry; here every block depends on "
        "all earlier ones. a_log and dt_bias are random per trial. Our reference takes no group "
        "arguments (the original's None groups mean another workload); the groups are the problem's "
        "tp-cp mesh, passed to a file in the original's convention. The reference packs the five "
        "all-gathers into one, computes only the blocks that reach its own, in the chunked form, and "
        "sums the TP pair in float32. W must be even and >= 4."
    ),
}
