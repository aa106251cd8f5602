"""The original benchmark's problem 56, exactly: two pipeline stages of a causal attention layer, each
with ring attention over CP = W / 2 ranks.

The original's input builder makes the groups: rank r has PP stage p = r // (W / 2) and CP index
c = r % (W / 2); the CP groups are the stages' contiguous blocks {p W/2 .. (p + 1) W/2 - 1}, the PP
groups {c, c + W/2}. As it draws them (bf16, standard normal): hidden_states [16, 16 / (W / 2), 512]
from a seed of the CP index (the same on both stages), and from a seed of the stage, w_qkv
[1536, 512] (q, k, v rows of 8 heads of 64) and w_o [512, 512], both times 0.02. It is called as
solution(hidden_states, w_qkv, w_o, 8, None, True, cp_group, pp_group). Stage 0 applies its layer
(QKV projection in bf16, causal attention over its CP group's tokens up to its own in float32, scale
1 / 8, rounded to bf16, then w_o) to hidden_states and sends the result to the rank of stage 1 with
its CP index; stage 1 applies its layer to what it receives (its own hidden_states unused). Every
rank returns its stage's output, [16, 16 / (W / 2), 512] bf16. Judged as the original harness
judges: atol = rtol = 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's,
docs/variants.md).

With weights of 0.02 each layer shrinks its input: stage 0's outputs have an RMS of about 0.1,
stage 1's about 0.02, twice atol, so the tolerance judges stage 1 loosely (a stage 1 returning zeros
still fails at most elements: 61% of them exceed atol, computed on CPU for one draw). The groups are
made once per process, on the first inputs, as the original's builder makes them once per run.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 56
NAME = "ring_attention_pp"
CATEGORY = "CP+PP"
SOURCE = "ring-flash-attention ring attention inside a 2-stage pipeline"
SUMMARY = "Two pipeline stages of a causal attention layer, each over CP = W/2 ranks; bf16 [16, S_l, 512]."
DTYPE = "bfloat16"
WORLD_SIZES = "even world size >= 2 (PP = 2 stages x CP = W/2)"
N_PP = 2
SIZES = {"pkb": {"batch": 16, "seq": 16, "heads": 8, "head_dim": 64}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}
WEIGHT_SCALE = 0.02

_GROUPS = {}  # world size -> this rank's (CP group, PP group)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 and world_size % N_PP == 0 else "needs an even world size (2 stages)"


def _groups(world_size):
    """This rank's (CP group, PP group), created on the first call and cached (every rank creates
    every group, in the original's order); None where no process group is up (shapes only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    if world_size not in _GROUPS:
        rank, n_cp = dist.get_rank(), world_size // N_PP
        cp_group = pp_group = None
        for p in range(N_PP):
            g = dist.new_group([p * n_cp + c for c in range(n_cp)])
            if rank // n_cp == p:
                cp_group = g
        for c in range(n_cp):
            g = dist.new_group([p * n_cp + c for p in range(N_PP)])
            if rank % n_cp == c:
                pp_group = g
        _GROUPS[world_size] = (cp_group, pp_group)
    return _GROUPS[world_size]


def make_inputs(ctx):
    """The original's: hidden states per CP index, weights per stage, its groups."""
    s = ctx.size
    n_cp = ctx.world_size // N_PP
    p, c = ctx.rank // n_cp, ctx.rank % n_cp
    hidden = s["heads"] * s["head_dim"]
    x = ctx.randn(n_cp, s["batch"], max(1, s["seq"] // n_cp), hidden, shared=True)[c].clone()
    w_qkv = ctx.randn(N_PP, 3 * hidden, hidden, shared=True, scale=WEIGHT_SCALE)[p].clone()
    w_o = ctx.randn(N_PP, hidden, hidden, shared=True, scale=WEIGHT_SCALE)[p].clone()
    cp_group, pp_group = (None, None) if ctx.is_meta else _groups(ctx.world_size)
    return x, w_qkv, w_o, s["heads"], None, True, cp_group, pp_group


def _attention(q, k, v, scale, causal, group):
    """This rank's rows of attention over its group's blocks, float32 from bf16 q, k, v [B, S, h, d]
    (k and v all-gathered once): float32 [B, h, S, d]."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    b, s, h, d = q.shape
    kv = torch.stack([k, v]).contiguous()
    if n > 1:
        gathered = kv.new_empty(n * 2, b, s, h, d)
        _all_gather(gathered, kv, group=group)
        kv = gathered
    blocks = rank + 1 if causal else n
    kv = kv.view(n, 2, b, s, h, d)[:blocks].permute(1, 2, 4, 0, 3, 5).reshape(2, b, h, blocks * s, d)
    scores = torch.matmul(q.transpose(1, 2).float(), kv[0].float().transpose(-2, -1)) * scale
    if causal:
        above = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
        scores[..., rank * s :].masked_fill_(above, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), kv[1].float())


@torch.no_grad()
def solution(
    hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False, cp_group=None, pp_group=None
):
    cp_group = cp_group or dist.group.WORLD
    b, s, _ = hidden_states.shape
    d = w_qkv.shape[0] // 3 // num_heads
    scale = float(softmax_scale if softmax_scale is not None else d**-0.5)
    stage, stages = (0, 1) if pp_group is None else (dist.get_rank(pp_group), dist.get_world_size(pp_group))
    x = hidden_states
    if stage > 0:
        x = torch.empty_like(hidden_states)
        dist.recv(x, src=dist.get_global_rank(pp_group, stage - 1))
    q, k, v = F.linear(x, w_qkv).view(b, s, 3, num_heads, d).unbind(dim=2)
    ctx = _attention(q, k, v, scale, causal, cp_group).to(x.dtype)
    out = F.linear(ctx.transpose(1, 2).reshape(b, s, num_heads * d), w_o)
    if stage + 1 < stages:
        dist.send(out, dst=dist.get_global_rank(pp_group, stage + 1))
    return out


def traffic(ctx):
    """Per GPU, each direction: the reference's schedule, W/2 - 1 blocks of keys and values over the
    CP group (the last CP rank needs them all) and one output block between the stages. FLOPs: the
    QKV and O GEMMs and its causal share of the attention. Memory: read the inputs, write the
    output."""
    s, w = ctx.size, ctx.world_size
    n_cp = w // N_PP
    b, d = s["batch"], s["head_dim"]
    hidden = s["heads"] * d
    s_local = max(1, s["seq"] // n_cp)
    isz = ctx.dtype.itemsize
    tokens = b * s_local
    return {
        "nvlink_bytes": ((n_cp - 1) * 2 * tokens * hidden + tokens * hidden) * isz,
        "hbm_bytes": (2 * tokens * hidden + 4 * hidden * hidden) * isz,
        "flops": 8 * tokens * hidden * hidden + 2 * b * hidden * s_local * s_local * (n_cp + 1),
        "rounds": 2 if n_cp > 1 else 1,
    }
