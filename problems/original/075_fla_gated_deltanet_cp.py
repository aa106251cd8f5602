"""The original benchmark's problem 75, exactly: Gated DeltaNet over a sequence split across ranks, by heads.

As the original's input builder makes them (a seed per rank): rank r holds tokens r 64 .. (r+1) 64 - 1
of the sequence with every head, H = 6 rounded up to a multiple of W (6 at W = 2, 8 at W = 4 and 8):
q, k [1, 64, H, 256], v [1, 64, H, 512] and gate [1, 64, H] bf16 standard normal, beta [1, 64, H] =
sigmoid of a standard normal in bf16, and its H / W heads' slices of the constants a_log =
linspace(0, 0.2, H) and dt_bias = linspace(-0.1, 0.1, H) in bf16. Called as solution(q, k, v, gate,
beta, a_log, dt_bias, None). All-to-alls move every rank's tokens of heads r H/W .. (r+1) H/W - 1 to
rank r, which runs the gated delta rule over the whole sequence in float32 (q, k L2-normalised with
eps 1e-6, q scaled by 256 ** -0.5; decay_t = exp(-exp(a_log) softplus(gate_t + dt_bias)) per head;
S_t = decay_t S_{t-1}, S_t += k_t (beta_t (v_t - k_t^T S_t))^T, o_t = q_t^T S_t from S_0 = 0), rounds
to bf16 and all-to-alls the outputs back: every rank returns its tokens, [1, 64, H, 512] bf16. Judged
as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret
seeds (pkb's, docs/variants.md).

What a solution could skip: most of the exchange. With gate standard normal a step's decay is about
0.5, so the state forgets within a few tokens: a rank that all-gathers the per-head constants and
runs every head over its own tokens and the last 8 tokens of the rank before it meets the bounds
(10 of 10 random sequences at W = 2 on CPU: |error| - rtol |ref| at most 5e-5, against atol 1e-2);
from a zero state (no exchange at all) 7 of 10 pass. The
`pkb` variant draws gate so that the state keeps the whole sequence.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 75
NAME = "fla_gated_deltanet_cp"
CATEGORY = "CP/Ulysses"
SOURCE = "flash-linear-attention Gated DeltaNet (head-parallel context parallelism)"
SUMMARY = "Gated delta rule over bf16 [1, 64, H, 256/512] sequence shards, N(0, 1) gates (the original's)."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (heads: 6 rounded up to a multiple of W)"
SIZES = {"pkb": {"batch": 1, "seq_local": 64, "heads": 6, "key_dim": 256, "value_dim": 512}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
CHUNK = 16  # steps: a step's log-decay reaches about -5 with the original's gates (pkb's chunks: 64)


def _heads(size, world_size):
    return -(-size["heads"] // world_size) * world_size


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    """The original's: q, k, v, gate standard normal, beta a bf16 sigmoid of one; this rank's slices
    of the linspaces a_log and dt_bias; group None."""
    s = ctx.size
    b, n, kd, vd = s["batch"], s["seq_local"], s["key_dim"], s["value_dim"]
    h = _heads(s, ctx.world_size)
    q, k, v = ctx.randn(b, n, h, kd), ctx.randn(b, n, h, kd), ctx.randn(b, n, h, vd)
    gate = ctx.randn(b, n, h)
    beta = ctx.randn(b, n, h, dtype=torch.bfloat16).sigmoid().to(ctx.dtype)
    local = h // ctx.world_size
    mine = slice(ctx.rank * local, (ctx.rank + 1) * local)
    a_full = torch.linspace(0.0, 0.2, h, dtype=torch.bfloat16, device=ctx.device)
    dt_full = torch.linspace(-0.1, 0.1, h, dtype=torch.bfloat16, device=ctx.device)
    return q, k, v, gate, beta, a_full[mine].clone(), dt_full[mine].clone(), None


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


def gated_delta_heads(q, k, v, gate, beta, a_log, dt_bias):
    """The float32 outputs [B, S, h, V] of the heads whose whole sequence is given ([B, S, h, ...])."""
    b, seq, h, kd = q.shape
    q = F.normalize(q.float(), p=2, dim=-1, eps=1e-6) * kd**-0.5
    k = F.normalize(k.float(), p=2, dim=-1, eps=1e-6)
    log_decay = -a_log.float().exp() * F.softplus(gate.float() + dt_bias.float())

    def heads_first(t):
        return t.transpose(1, 2).reshape(b * h, seq, *t.shape[3:])

    out = chunked_delta_rule(
        heads_first(q),
        heads_first(k),
        heads_first(v.float()),
        heads_first(log_decay.unsqueeze(-1)),
        heads_first(beta.float()),
    )
    return out.view(b, h, seq, -1).transpose(1, 2)


@torch.no_grad()
def solution(q, k, v, gate, beta, a_log, dt_bias, group=None):
    w = dist.get_world_size(group)
    b, n, h, kd = q.shape
    vd = v.shape[-1]
    hl = h // w
    # one send buffer [W, B, L, H/W, K + K + V + 2]: rank j's heads of every field
    fields = torch.cat([q, k, v, gate.unsqueeze(-1), beta.unsqueeze(-1)], dim=-1)
    send = fields.view(b, n, w, hl, -1).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    whole = recv.permute(1, 0, 2, 3, 4).reshape(b, w * n, hl, -1)  # this rank's heads, every token
    parts = whole.split([kd, kd, vd, 1, 1], dim=-1)
    out = gated_delta_heads(*parts[:3], parts[3].squeeze(-1), parts[4].squeeze(-1), a_log, dt_bias)
    send = out.to(q.dtype).view(b, w, n, hl, vd).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, n, h, vd)


def traffic(ctx):
    """Per GPU, the least (pkb's schedules, problems/075): the head-parallel all-to-alls, (W - 1)/W
    of the rank's inputs out and of its outputs back, or one [K, V] bf16 state per head from the
    previous rank. FLOPs: the state products, 6 K V per token and head. Memory: inputs read, the
    output written."""
    w, s = ctx.world_size, ctx.size
    b, n, kd, vd = s["batch"], s["seq_local"], s["key_dim"], s["value_dim"]
    h = _heads(s, w)
    item = ctx.dtype.itemsize
    inputs = b * n * h * (2 * kd + vd + 2) * item
    output = b * n * h * vd * item
    return {
        "nvlink_bytes": min((w - 1) / w * (inputs + output), b * h * kd * vd * 2),
        "hbm_bytes": inputs + output,
        "flops": 6 * b * n * h * kd * vd,
        "rounds": 1,
    }
