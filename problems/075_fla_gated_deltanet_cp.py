"""Gated DeltaNet over a sequence split across ranks, computed head-parallel (Ulysses layout).

Rank r holds tokens r*L .. (r+1)*L - 1 of a sequence of S = W * L tokens, with every head:
q, k bf16 [B, L, H, K], v bf16 [B, L, H, V], gate [B, L, H], beta [B, L, H] (in (0, 1)), and the
per-head parameters of its own H/W heads, a_log and dt_bias [H/W] (heads r*H/W .. (r+1)*H/W - 1).
H is the preset's head count rounded up to a multiple of W (as the original does). Every rank must
return its tokens of the gated delta rule's output, bf16 [B, L, H, V], computed per head over the
whole sequence in float32:

  q_t, k_t = L2-normalised q, k (eps 1e-6), q_t scaled by K**-0.5
  decay_t = exp(-exp(a_log) * softplus(gate_t + dt_bias))               (a scalar per head and step)
  S_t = decay_t S_{t-1};  u_t = beta_t (v_t - k_t^T S_t);  S_t += k_t u_t^T;  o_t = q_t^T S_t

with S_0 = 0, a [K, V] state per head. Each head needs the whole sequence; the rank owning a head's
parameters is where the original computes it.

Reference: one all-to-all moves every rank's q, k, v, gate, beta of the heads rank j owns to rank j
(packed into one buffer), the rank runs the recurrence of its H/W heads over the whole sequence in the
chunked (WY) form of the delta rule, and one all-to-all sends each rank its tokens back. The chunked
form (chunks of 64 steps) solves each chunk's unit-lower-triangular system for the pseudo-values
u = (I + A)^-1 beta (v - k S) at once and carries the state from chunk to chunk: S/64 steps of
matrix products instead of S steps of matrix-vector products. It equals the recurrence in exact
arithmetic; in float32 it is within 1e-5 of a float64 step-by-step recurrence on these inputs
(tests/test_problems_linear_attention.py). Within a chunk, keys are scaled by exp(-cumulative
log-decay), at most exp(64 * 0.03) here, so the form loses nothing to overflow.

Inputs: q, k, v standard normal, different on every rank and in every trial. gate is drawn from
U(-7, -4), so decay_t lies in 0.978 .. 0.999: the state keeps most of the sequence (the last rank's
outputs depend on the first rank's tokens). beta = sigmoid(N(0, 1)). The per-head parameters are
drawn afresh in every trial (shared by all ranks, each rank passed its slice): a_log from U(0, 0.2),
dt_bias from U(-0.1, 0.1), the original's ranges.

Source: flash-linear-attention's Gated DeltaNet with Ulysses-style context parallelism
(ParallelKernelBench problem 75). The signature and the call (q, k, v, gate, beta, a_log, dt_bias,
None) are the original's; group None is the default group.

Differences from the original: the original draws gate from N(0, 1), so each step's decay is about
0.5: the state forgets within ~30 tokens, and a solution could skip the all-to-all and compute every
head on its own tokens with a short halo from the previous rank. Here gate is drawn from U(-7, -4)
(decay 0.978-0.999), so every head needs its whole sequence. a_log and dt_bias are random per trial
instead of fixed linspaces. The reference packs the five all-to-alls into one and computes the
recurrence in the chunked form instead of a 64 * W-step Python loop.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 75
NAME = "fla_gated_deltanet_cp"
CATEGORY = "CP/Ulysses"
SOURCE = "flash-linear-attention Gated DeltaNet (head-parallel context parallelism)"
SUMMARY = "Gated delta-rule recurrence over a sequence split across ranks: all-to-all to heads and back."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (heads rounded up to a multiple of W)"
SIZES = {
    # seq_local: tokens per rank; heads: rounded up to a multiple of W (the original's rule)
    "pkb": {"batch": 1, "seq_local": 64, "heads": 6, "key_dim": 256, "value_dim": 512},
    # W = 2: 8 heads per rank over 8192 tokens, 128 chunks in sequence; per chunk ~10 kernels on
    # [8, 64, 256]x[8, 256, 512] float32 operands (~6 * 8192 * 8 * 256 * 512 = 52 GFLOP in all, ~1 ms
    # at ~50 TFLOP/s float32) plus ~128 * 10 launches (~1-2 ms): a few ms on an H200 (an estimate
    # until measured); all-to-alls of 2 x 67 MB per rank, ~0.3 ms
    "large": {"batch": 1, "seq_local": 4096, "heads": 16, "key_dim": 256, "value_dim": 512},
}
# Outputs are bf16 of RMS ~0.015, max ~0.08 (q is scaled by K**-0.5). The float32 chunked reference
# and a file in the original's convention (five all-to-alls, the recurrence step by step in float32,
# tests/candidates/by_problem/075_original_style.py) differ by at most 1.2e-4, relative norm 4.2e-5
# (CPU, W = 2, 2 trials); atol leaves room for bf16 products in the chunk (as flash-linear-attention's
# kernels use), unmeasured. Computing each rank's tokens from a zero state (no exchange;
# 075_no_state.py) is off by ~80% in norm on the last rank.
TOLERANCE = {"atol": 1e-3, "rtol": 0.02, "rel_norm": 0.01}
CHUNK = 64

_all_to_all = dist.all_to_all_single


def _heads(size, world_size):
    return -(-size["heads"] // world_size) * world_size


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): a batch of 2, blocks
    in multiples of the 64-token chunk, heads in multiples of W (split over the ranks), head dims in 64s."""
    return {
        "batch": draw("batch", 1, 2),
        "seq_local": draw("seq_local", 64, 192, 64),
        "heads": draw("heads", world_size, 3 * world_size, world_size),
        "key_dim": draw("key_dim", 64, 192, 64),
        "value_dim": draw("value_dim", 128, 448, 64),
    }


def make_inputs(ctx):
    """The original's call: q, k, v, gate, beta [B, L, H, ...], this rank's a_log and dt_bias [H/W],
    group None."""
    s = ctx.size
    b, n, kd, vd = s["batch"], s["seq_local"], s["key_dim"], s["value_dim"]
    h = _heads(s, ctx.world_size)
    q = ctx.randn(b, n, h, kd)
    k = ctx.randn(b, n, h, kd)
    v = ctx.randn(b, n, h, vd)
    gate = ctx.rand(b, n, h, low=-7.0, high=-4.0)
    beta = ctx.randn(b, n, h).float().sigmoid().to(ctx.dtype)
    a_full = ctx.rand(h, low=0.0, high=0.2, shared=True)
    dt_full = ctx.rand(h, low=-0.1, high=0.1, shared=True)
    local = h // ctx.world_size
    mine = slice(ctx.rank * local, (ctx.rank + 1) * local)
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


def solution(q, k, v, gate, beta, a_log, dt_bias, group=None):
    w = dist.get_world_size(group)
    b, n, h, kd = q.shape
    vd = v.shape[-1]
    hl = h // w
    # one send buffer [W, B, L, H/W, K + K + V + 2]: rank j's heads of every field, token-major
    fields = torch.cat([q, k, v, gate.unsqueeze(-1), beta.unsqueeze(-1)], dim=-1)
    send = fields.view(b, n, w, hl, -1).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    _all_to_all(recv, send, group=group)
    # [B, W * L, H/W, ...]: the whole sequence of this rank's heads, in token order
    whole = recv.permute(1, 0, 2, 3, 4).reshape(b, w * n, hl, -1)
    parts = whole.split([kd, kd, vd, 1, 1], dim=-1)
    out = gated_delta_heads(*parts[:3], parts[3].squeeze(-1), parts[4].squeeze(-1), a_log, dt_bias)
    # back: rank j's tokens of this rank's heads
    send = out.to(q.dtype).view(b, w, n, hl, vd).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    _all_to_all(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, n, h, vd)


def traffic(ctx):
    """Per GPU, each direction: the minimum of two schedules.

    Head-parallel (the reference's): (W - 1)/W of the rank's q, k, v, gate, beta out and of its output
    tokens back. Sequence-parallel: each rank runs every head over its own tokens from the state the
    previous rank's tokens leave, received from that rank: one [K, V] state per head in bf16 (the least
    a state can be sent in); it costs W - 1 dependent rounds, the head-parallel schedule one, so the
    latency term counts one. FLOPs: the state products of the chunked form, 6 K V per token and head
    (q S, u's correction k S, the state update), of the rank's share S H / W; the intra-chunk products
    are not counted (a lower bound). Memory: read the inputs, write the output once.
    """
    w, s = ctx.world_size, ctx.size
    b, n, kd, vd = s["batch"], s["seq_local"], s["key_dim"], s["value_dim"]
    h = _heads(s, w)
    item = ctx.dtype.itemsize
    inputs = b * n * h * (2 * kd + vd + 2) * item
    output = b * n * h * vd * item
    heads_schedule = (w - 1) / w * (inputs + output)
    state_schedule = b * h * kd * vd * 2
    return {
        "nvlink_bytes": min(heads_schedule, state_schedule),
        "hbm_bytes": inputs + output,
        "flops": 6 * b * n * h * kd * vd,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, "
        "beta: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, "
        "group: Optional[dist.ProcessGroup] = None) -> torch.Tensor"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "gate is drawn from U(-7, -4) instead of N(0, 1): the original's per-step decay of ~0.5 forgets "
        "within ~30 tokens, so a solution could skip the all-to-all and use a short halo; here every "
        "head needs its whole sequence. a_log and dt_bias are random per trial. The reference packs "
        "the five all-to-alls into one and computes the recurrence in the chunked form."
    ),
}
