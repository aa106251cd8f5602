"""The original benchmark's problem 57, exactly: the backward of non-causal ring attention over
CP = W / 2 ranks, its gradients averaged over DP = 2 replicas.

The original's input builder makes the groups (Megatron's cp-dp order): first one group of all
ranks (which it does not pass), then the DP groups {c, c + W/2} and the CP groups, each replica's
contiguous block {d W/2 .. (d + 1) W/2 - 1}; rank r has DP index d = r // (W / 2) and CP index
c = r % (W / 2). As it draws them (bf16, standard normal, a seed per rank): dout, q, k, v
[16, 16 / (W / 2), 8, 64]; and it computes from them, on the rank alone, out = softmax(q k^T / 8) v
in float32 rounded to bf16 and softmax_lse [16, 8, 16 / (W / 2)] float32, over the rank's own keys
only, without a mask. It is called as solution(dout, q, k, v, out, softmax_lse, None, False,
cp_group, dp_group). Each rank computes ring attention's backward over its CP group, non-causal,
with the given out and log-sum-exp (P = exp(q k^T / 8 - lse) for every CP block, dS = P (dout v^T -
rowsum(dout * out))): dq = dS k / 8 over all keys of its group; dk = dS^T q / 8 and dv = P^T dout
over all queries of its group for its own keys; rounds each to bf16, all-reduces it over its DP
pair in bf16 and divides by 2. It returns (dq, dk, dv), bf16 [16, 16 / (W / 2), 8, 64] each. Judged
as the original harness judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret
seeds (pkb's, docs/variants.md).

out and softmax_lse are those of the rank's own block, not of the attention over its CP group, so
the probabilities of the other blocks are not normalized with theirs: the workload is the
original's arithmetic on those inputs, not a consistent gradient. At W = 2 the CP group is one rank:
only the DP average communicates. The original asserts that W divides the 8 heads. The groups are
made once per process, on the first inputs, as the original's builder makes them once per run.
"""

import math

import torch
import torch.distributed as dist

ID = 57
NAME = "ring_attention_backward_dp"
CATEGORY = "CP+DP"
SOURCE = "ring-flash-attention ring attention backward with data-parallel averaging"
SUMMARY = "Non-causal ring attention backward (dq, dk, dv bf16 [16, S_l, 8, 64]) over CP = W/2, DP mean."
DTYPE = "bfloat16"
WORLD_SIZES = "2, 4 or 8 (DP = 2 x CP = W/2; W divides the 8 heads, as the original asserts)"
N_DP = 2
SIZES = {"pkb": {"batch": 16, "seq": 16, "heads": 8, "head_dim": 64}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

_GROUPS = {}  # world size -> this rank's (CP group, DP group)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2 or world_size % N_DP or size["heads"] % world_size:
        return f"needs an even world size >= 2 dividing the {size['heads']} heads (the original asserts it)"
    return None


def _groups(world_size):
    """This rank's (CP group, DP group), created on the first call and cached (every rank creates
    every group, in the original's order); None where no process group is up (shapes only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    if world_size not in _GROUPS:
        rank, n_cp = dist.get_rank(), world_size // N_DP
        dist.new_group(list(range(world_size)))  # the original's DP-with-CP group, made first, unused
        cp_group = dp_group = None
        for c in range(n_cp):
            g = dist.new_group([d * n_cp + c for d in range(N_DP)])
            if rank % n_cp == c:
                dp_group = g
        for d in range(N_DP):
            g = dist.new_group([d * n_cp + c for c in range(n_cp)])
            if rank // n_cp == d:
                cp_group = g
        _GROUPS[world_size] = (cp_group, dp_group)
    return _GROUPS[world_size]


def make_inputs(ctx):
    """The original's: dout, q, k, v standard normal; out and its log-sum-exp over the rank's own
    keys; scale None, not causal; its groups."""
    s = ctx.size
    shape = (s["batch"], max(1, s["seq"] // (ctx.world_size // N_DP)), s["heads"], s["head_dim"])
    q, k, v, dout = (ctx.randn(*shape) for _ in range(4))
    if ctx.is_meta:
        out = torch.empty(shape, dtype=ctx.dtype, device="meta")
        lse = torch.empty(shape[0], shape[2], shape[1], device="meta")
    else:
        scores = torch.matmul(q.transpose(1, 2).float(), k.transpose(1, 2).float().transpose(-2, -1))
        scores = scores * s["head_dim"] ** -0.5
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(1, 2).float())
        out = out.transpose(1, 2).contiguous().to(ctx.dtype)
    cp_group, dp_group = (None, None) if ctx.is_meta else _groups(ctx.world_size)
    return dout, q, k, v, out, lse, None, False, cp_group, dp_group


def _gather(t, group, n):
    if n == 1:
        return t.unsqueeze(0)
    out = t.new_empty(n * t.shape[0], *t.shape[1:])
    _all_gather(out, t.contiguous(), group=group)
    return out.view(n, *t.shape)


@torch.no_grad()
def solution(dout, q, k, v, out, softmax_lse, softmax_scale=None, causal=False, cp_group=None, dp_group=None):
    cp_group = cp_group or dist.group.WORLD
    n, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
    b, s, h, d = q.shape
    scale = float(softmax_scale if softmax_scale is not None else d**-0.5)
    # [B, h, S, d] float32, and each query's rowsum(dout * out)
    qh, kh, vh, doh = (t.transpose(1, 2).float() for t in (q, k, v, dout))
    row_dot = (doh * out.transpose(1, 2).float()).sum(dim=-1, keepdim=True)
    # every CP rank's blocks, [n, 4, B, h, S, d] and [n, 2, B, h, S, 1]
    blocks = _gather(torch.stack([qh, kh, vh, doh]), cp_group, n)
    stats = _gather(torch.stack([softmax_lse.unsqueeze(-1), row_dot]), cp_group, n)
    qa, ka, va, da = (blocks[:, i].permute(1, 2, 0, 3, 4).reshape(b, h, n * s, d) for i in range(4))
    lse_a, dot_a = (stats[:, i].permute(1, 2, 0, 3, 4).reshape(b, h, n * s, 1) for i in range(2))
    probs = torch.exp(torch.matmul(qa, ka.transpose(-2, -1)) * scale - lse_a)
    if causal:
        probs.masked_fill_(torch.ones(n * s, n * s, dtype=torch.bool, device=q.device).triu_(1), 0.0)
    ds = probs * (torch.matmul(da, va.transpose(-2, -1)) - dot_a)
    mine = slice(rank * s, (rank + 1) * s)
    dq = torch.matmul(ds[:, :, mine], ka) * scale
    dk = torch.matmul(ds[:, :, :, mine].transpose(-2, -1), qa) * scale
    dv = torch.matmul(probs[:, :, :, mine].transpose(-2, -1), da)
    grads = [g.transpose(1, 2).contiguous().to(q.dtype) for g in (dq, dk, dv)]
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        for g in grads:
            dist.all_reduce(g, op=dist.ReduceOp.SUM, group=dp_group)
            g.div_(dist.get_world_size(dp_group))
    return tuple(grads)


def traffic(ctx):
    """Per GPU, each direction: the reference's schedule, the ring of W/2 - 1 key and value blocks and
    of as many partial dk, dv blocks over the CP group, then the DP all-reduce of dq, dk, dv (one
    exchange each way in a pair). FLOPs: the five [S_l, S] products of every block. Memory: read the
    six inputs, write three gradients."""
    s, w = ctx.size, ctx.world_size
    n_cp = w // N_DP
    b, h, d = s["batch"], s["heads"], s["head_dim"]
    s_local = max(1, s["seq"] // n_cp)
    block = b * s_local * h * d * ctx.dtype.itemsize
    return {
        "nvlink_bytes": (n_cp - 1) * 4 * block + 3 * block,
        "hbm_bytes": 8 * block + b * h * s_local * 4,
        "flops": 10 * b * h * d * s_local * s_local * n_cp,
        "rounds": 2 * (n_cp - 1) + 1,
    }
