"""The original benchmark's problem 74, exactly: Kimi Delta Attention over a CP-split sequence, TP-summed.

As the original's input builder makes them (a seed per rank): at an even W >= 4 the ranks form its
tp-cp mesh, TP innermost (TP groups {2c, 2c + 1}, CP groups {t, t + 2, ...}); at any other W the CP
group is the world and there is no TP group. Rank r holds, as block c (its CP rank) of its CP group's
sequence, q, k, g [1, 64, 16, 128] and v [1, 64, 16, 128], beta [1, 64, 16], all bf16 standard
normal and different on every rank, and the constants a_log = linspace(-0.1, 0.1, 16) and dt_bias =
linspace(-0.1, 0.1, 2048) in bf16. Called as solution(q, k, v, g, beta, a_log, dt_bias, cp_group,
tp_group). Per head, in float32 (q and k L2-normalised, q scaled by 128 ** -0.5, beta sigmoid):
decay_t = exp(-5 sigmoid(exp(a_log) (g_t + dt_bias))) per key channel, S_t = diag(decay_t) S_{t-1},
S_t += k_t (beta_t (v_t - k_t^T S_t))^T, o_t = q_t^T S_t from S_0 = 0 over the CP group's sequence.
Each rank returns its block of o in bf16, [1, 64, 16, 128], summed in bf16 over its TP pair where
there is one. Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs
are drawn from secret seeds (pkb's, docs/variants.md).

What a solution could skip: the CP exchange. With g standard normal a key channel's decay is about
0.08 a step, so the state forgets within a few tokens: a rank that runs the recurrence over its own
block from a zero state passes (3 trials at W = 2 on CPU; in float32
over 20 random sequences its worst error used 86% of the bound, with a halo of 2 tokens 6%). At
even W >= 4 the TP sum cannot be skipped (the pair's ranks hold different data). The `pkb` variant
draws g so that the state keeps the whole sequence.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 74
NAME = "fla_kimi_delta_attention_cp_tp"
CATEGORY = "CP+TP"
SOURCE = "flash-linear-attention Kimi Delta Attention (context parallelism x tensor parallelism)"
SUMMARY = "Kimi Delta Attention of bf16 [1, 64, 16, 128] CP blocks, N(0, 1) gates, TP pairs at W >= 4."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (TP = 2 at even W >= 4, else CP = W)"
PASSES_WITHOUT_EXCHANGE = (
    "the state forgets within a few tokens: each rank's recurrence over its own block from a zero "
    "state passes"
)
SIZES = {"pkb": {"batch": 1, "seq_local": 64, "heads": 16, "key_dim": 128, "value_dim": 128}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
N_TP = 2
LOWER_BOUND = -5.0
CHUNK = 8  # steps: e^-G within a chunk stays below e^40 with the original's gates (pkb's: 64)

_GROUPS = {}  # world size -> this rank's (TP group or None, CP group)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _groups(world_size):
    """This rank's (TP group, CP group) as the original builds them, created once and cached (every
    rank creates every group, in the original's order); (None, None) where no process group is up."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    if world_size not in _GROUPS:
        if world_size < 4 or world_size % N_TP:
            _GROUPS[world_size] = (None, dist.group.WORLD)
        else:
            rank, n_cp = dist.get_rank(), world_size // N_TP
            tp_group = cp_group = None
            for c in range(n_cp):
                g = dist.new_group([c * N_TP + t for t in range(N_TP)])
                if rank // N_TP == c:
                    tp_group = g
            for t in range(N_TP):
                g = dist.new_group([c * N_TP + t for c in range(n_cp)])
                if rank % N_TP == t:
                    cp_group = g
            _GROUPS[world_size] = (tp_group, cp_group)
    return _GROUPS[world_size]


def make_inputs(ctx):
    """The original's: q, k, v, g, beta standard normal per rank; a_log, dt_bias its linspaces."""
    s = ctx.size
    b, n, h, kd, vd = s["batch"], s["seq_local"], s["heads"], s["key_dim"], s["value_dim"]
    q, k = ctx.randn(b, n, h, kd), ctx.randn(b, n, h, kd)
    v, g, beta = ctx.randn(b, n, h, vd), ctx.randn(b, n, h, kd), ctx.randn(b, n, h)
    a_log = torch.linspace(-0.1, 0.1, h, dtype=torch.bfloat16, device=ctx.device)
    dt_bias = torch.linspace(-0.1, 0.1, h * kd, dtype=torch.bfloat16, device=ctx.device)
    tp_group, cp_group = (None, None) if ctx.is_meta else _groups(ctx.world_size)
    return q, k, v, g, beta, a_log, dt_bias, cp_group, tp_group


def chunked_delta_rule(q, k, v, log_decay, beta, chunk=CHUNK):
    """The delta rule with per-channel decay, in float32, for n independent heads: q, k [n, S, K] (q
    already scaled), v [n, S, V], log_decay [n, S, K] (<= 0), beta [n, S]; returns [n, S, V].

    Chunked (WY) form, as problems/074 (pkb's variant) has it: within a chunk, with cumulative
    log-decay G_t from the chunk's start, the pseudo-values u solve (I + A) u = beta (v - (k e^G) S0),
    A[t, j] = beta_t (k_t e^G_t) . (k_j e^-G_j) for j < t; outputs (q e^G) S0 + tril(A_qk) u; the
    state moves to e^G_C S0 + (k e^(G_C - G))^T u. Equal to the step-by-step recurrence in exact
    arithmetic; a step's log-decay reaches -5 with the original's gates, so chunks are short."""
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
    g = log_decay.reshape(n, m, chunk, kd).cumsum(2)
    q_in, k_in, k_out = q * g.exp(), k * g.exp(), k * (-g).exp()
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril_(-1)
    a = (beta * (k_in @ k_out.transpose(-1, -2))).masked_fill_(~strict, 0.0)
    a.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    solved = torch.linalg.solve_triangular(
        a, torch.cat([beta * v, beta * k_in], dim=-1), upper=False, unitriangular=True
    )
    u_v, u_k = solved[..., :vd], solved[..., vd:]  # u = u_v - u_k S0
    a_qk = (q_in @ k_out.transpose(-1, -2)).masked_fill_(strict.T, 0.0)  # j <= t
    last = g[:, :, -1:]
    k_end = k * (last - g).exp()
    carry = last.exp().transpose(-1, -2)  # [n, m, K, 1]
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


@torch.no_grad()
def solution(q, k, v, g, beta, a_log, dt_bias, cp_group=None, tp_group=None):
    cp_group = cp_group or dist.group.WORLD
    cp, c = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    b, n, h, kd = q.shape
    vd = v.shape[-1]
    fields = torch.cat([q, k, v, g, beta.unsqueeze(-1)], dim=-1)  # [B, L, H, 3K + V + 1]
    gathered = fields.new_empty(cp * b, *fields.shape[1:])
    dist.all_gather_into_tensor(gathered, fields, group=cp_group)
    # blocks 0..c of the sequence: later blocks cannot reach block c
    prefix = gathered.view(cp, *fields.shape)[: c + 1].transpose(0, 1).reshape(b, (c + 1) * n, h, -1)
    parts = prefix.split([kd, kd, vd, kd, 1], dim=-1)
    out = kda_heads(*parts[:4], parts[4].squeeze(-1), a_log, dt_bias)[:, c * n :].to(q.dtype)
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=tp_group)  # in bf16, as the original sums
    return out


def traffic(ctx):
    """Per GPU, the least (pkb's schedules, problems/074): the earlier blocks' inputs or one [K, V]
    state per head in bf16 along the CP group, whichever is less, and at even W >= 4 the TP peer's
    output block; two dependent steps. FLOPs: the state products, 6 K V per token and head, over the
    rank's own block. Memory: the inputs read, the output written."""
    w, s = ctx.world_size, ctx.size
    b, n, h, kd, vd = s["batch"], s["seq_local"], s["heads"], s["key_dim"], s["value_dim"]
    item = ctx.dtype.itemsize
    tp = N_TP if w >= 4 and w % N_TP == 0 else 1
    block = b * n * h * (3 * kd + vd + 1) * item
    output = b * n * h * vd * item
    cp_bytes = min((w // tp - 1) * block, b * h * kd * vd * 2)
    return {
        "nvlink_bytes": cp_bytes + (output if tp > 1 else 0),
        "hbm_bytes": block + output,
        "flops": 6 * b * n * h * kd * vd,
        "rounds": 2 if tp > 1 else 1,
    }
