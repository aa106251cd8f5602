"""Two causal attention layers in a 2-stage pipeline, each layer context-parallel over its stage.

Ranks form a 2 x (W/2) mesh, CP innermost (Megatron's order, PP outermost): rank r is in pipeline
stage p = r // (W/2) with CP index c = r % (W/2). The CP groups are the stages, {0 .. W/2 - 1} and
{W/2 .. W - 1}; the PP groups are the pairs {c, c + W/2}. The sequence of S tokens is split into
W/2 contiguous blocks of S_local = S / (W/2) tokens, block c on CP index c of each stage. Rank r
holds
  hidden_states  bf16 [B, S_local, hidden]   stage 0: its block of the layer input; stage 1: not
                                              read (the original hands every rank a tensor of this
                                              shape; stage 1's input comes from stage 0)
  w_qkv          bf16 [3 * hidden, hidden]    its stage's fused QKV projection (q rows of every
                                              head, then k rows, then v rows; head_dim = hidden /
                                              num_heads rows per head)
  w_o            bf16 [hidden, hidden]        its stage's output projection
(the weights are the same on every rank of a stage and differ between the stages).

One layer is
  q, k, v = x @ w_qkv^T   (bf16 GEMM, rounded to bf16)
  ctx     = causal attention of q against the keys and values of the stage's tokens 0 .. its last
            one, scale = softmax_scale or 1/sqrt(head_dim), in float32, rounded to bf16
  layer(x) = ctx @ w_o^T  (bf16)
Stage 0 computes y0 = layer_0(hidden_states) on its block and sends it to its PP peer; stage 1
computes y1 = layer_1(y0). Every rank returns its stage's output for its block, bf16 [B, S_local,
hidden]: y0 on stage 0, y1 on stage 1. The reference all-gathers k and v over the stage once (ring
attention's W/2 - 1 ring steps deliver the same blocks), computes its rows of the attention in one
pass with float32 accuracy from bf16 operands (problem 54's method) and moves y0 with one send.

The CP and PP process groups are created once per process, on the first call, and cached
(dist.new_group is collective: every rank creates every group, in the same order).

Inputs: hidden_states standard normal, different on every rank and trial; each stage's weights are
drawn once per trial as N(0, 1/hidden), w_o times 2, so y0 and y1 are O(1) at `pkb`. Unlike problem
54, q is not scaled up: a sharper softmax in stage 1 would amplify stage 0's roundings past any
tolerance that still judges (TOLERANCE).

Source: ring-flash-attention's ring attention inside a 2-stage pipeline (ParallelKernelBench problem
56). A file written for the original gets its call (hidden_states, w_qkv, w_o, num_heads, None,
True, cp_group, pp_group) with the cached groups (ORIGINAL). Our signature is the original's without
the two groups: a solution makes its groups itself, once, in the layout above.

Differences from the original: the original draws its inputs from seed offsets left over from an
older numbering of its problems and leaves its world-size rule implicit; here the seeds derive from
the trial's secret and the rule (an even world size, PP = 2, CP = W/2 dividing seq) is checked.
`pkb` keeps the original's per-rank shapes at W = 8 (16 tokens, 4 per CP rank); `large` is a real
sequence. The sequence is split contiguously (not zigzag); the reference uses one all-gather instead
of a ring of sends. What each stage returns (its own output) is this problem's statement.
"""

import torch
import torch.distributed as dist

ID = 56
NAME = "ring_attention_pp"
CATEGORY = "CP+PP"
SOURCE = "ring-flash-attention ring attention inside a 2-stage pipeline"
SUMMARY = "Two causal attention layers, one per pipeline stage (PP = 2), each context-parallel over CP = W/2."
DTYPE = "bfloat16"
WORLD_SIZES = "even world size >= 2 (PP = 2 x CP = W/2, CP innermost) with W/2 dividing seq"
N_PP = 2
SIZES = {
    # batch: sequences; seq: tokens of the whole sequence (split over each stage's CP group);
    # hidden: model width; heads: attention heads, head_dim = hidden / heads
    "pkb": {"batch": 16, "seq": 16, "hidden": 512, "heads": 8},
    # At W = 2 (CP = 1) each stage scores 4096 queries against 4096 keys in 16 heads: 1 GiB of
    # float32 scores and some 12 GiB of HBM traffic over the passes on them, about 3 ms per stage
    # at H200's 4.3 TB/s, and stage 1 waits for stage 0: about 6 ms. An estimate until measured.
    "large": {"batch": 1, "seq": 4096, "hidden": 1024, "heads": 16},
}
# Outputs: RMS about 1.1 (y0) and 2.4 (y1) at `pkb`, 0.15 and 0.3 at a 4096-token sequence (float64,
# one stage-pair without CP). Correct solutions differ in rounding (q, k, v and ctx in bf16 or not,
# bf16 probabilities as in flash attention, y0 sent in float32), and stage 1 amplifies stage 0's
# rounding through its softmax. Measured on CPU (W = 2, 4; 4 trials): a float64 solution
# (tests/candidates/by_problem/056_float64.py) differs from the reference by up to 0.0625 on stage 1
# (relative norm <= 0.0045), one with flash attention's bf16 probabilities (056_bf16_probs.py) by
# up to 0.078 (relative norm <= 0.0043); with q scaled by 2, as in problem 54, stage 1 differed by up to 0.17,
# so q is not scaled here. The tolerance leaves a margin; at `large` the relative norm binds.
TOLERANCE = {"atol": 0.1, "rtol": 0.03, "rel_norm": 0.015}
Q_SCALE = 1.0
O_SCALE = 2.0

_GROUPS = {}  # world size -> (CP group, PP group) of this rank
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_bmm_out_dtype = [True]  # whether torch.bmm takes out_dtype on this build (CUDA, torch >= 2.8)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2 or world_size % N_PP:
        return "needs an even world size (PP = 2 x CP = W/2)"
    n_cp = world_size // N_PP
    if size["seq"] % n_cp:
        return f"seq = {size['seq']} is not divisible by the CP size W/2 = {n_cp}"
    if size["hidden"] % size["heads"]:
        return "heads must divide hidden"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): seq a multiple of the
    CP size W/2, head_dim 16 to 128 in 16s; sequences short, where the tolerance was measured."""
    n_cp = max(1, world_size // N_PP)
    heads = draw("heads", 2, 16)
    return {
        "batch": draw("batch", 1, 16),
        "seq": draw("seq", 2 * n_cp, max(32, 4 * n_cp), n_cp),
        "hidden": draw("hidden", 16 * heads, min(max(768, 32 * heads), 128 * heads), 16 * heads),
        "heads": heads,
    }


def _groups():
    """This rank's (CP group, PP group), created on the first call and cached."""
    w = dist.get_world_size()
    if w not in _GROUPS:
        n_cp = w // N_PP
        rank = dist.get_rank()
        cp_group = pp_group = None
        for p in range(N_PP):
            g = dist.new_group([p * n_cp + c for c in range(n_cp)])
            if rank // n_cp == p:
                cp_group = g
        for c in range(n_cp):
            g = dist.new_group([p * n_cp + c for p in range(N_PP)])
            if rank % n_cp == c:
                pp_group = g
        _GROUPS[w] = (cp_group, pp_group)
    return _GROUPS[w]


def make_inputs(ctx):
    """Our call: (hidden_states, w_qkv, w_o, num_heads, None, True), the original's without its groups."""
    b, s, hidden, heads = ctx.size["batch"], ctx.size["seq"], ctx.size["hidden"], ctx.size["heads"]
    n_cp = ctx.world_size // N_PP
    p = ctx.rank // n_cp
    x = ctx.randn(b, s // n_cp, hidden)
    w_qkv = ctx.randn(N_PP, 3, hidden, hidden, shared=True, scale=hidden**-0.5)[p].clone()
    w_qkv[0] *= Q_SCALE
    w_o = ctx.randn(N_PP, hidden, hidden, shared=True, scale=O_SCALE * hidden**-0.5)[p].clone()
    return x, w_qkv.view(3 * hidden, hidden), w_o, heads, None, True


def _matmul_f32(a, b):
    """Batched a @ b of bf16 [n, i, k] and [n, k, j]: exact products, float32 sums and result."""
    if a.is_cuda and _bmm_out_dtype[0]:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (TypeError, RuntimeError):  # an older torch: the float32 product gives the same result
            _bmm_out_dtype[0] = False
    return torch.bmm(a.float(), b.float())


def _attention(q, k, v, scale, causal, group):
    """Rows of this CP rank's block of causal attention: q, k, v bf16 [B, S_l, h, D] -> float32
    [B*h, S_l, D]. All-gathers k and v over the CP group once."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    b, s_l, h, d = q.shape
    local = torch.stack([k, v])
    if n > 1:
        gathered = local.new_empty(n * 2, b, s_l, h, d)
        _all_gather(gathered, local, group=group)
    else:
        gathered = local
    blocks = rank + 1 if causal else n
    kv = gathered.view(n, 2, b, s_l, h, d)[:blocks]
    kv = kv.permute(1, 2, 4, 0, 3, 5).reshape(2, b * h, blocks * s_l, d)
    qh = q.permute(0, 2, 1, 3).reshape(b * h, s_l, d)
    scores = _matmul_f32(qh, kv[0].transpose(1, 2)).mul_(scale)
    if causal:
        above = torch.ones(s_l, s_l, dtype=torch.bool, device=q.device).triu_(1)
        scores[:, :, rank * s_l :].masked_fill_(above, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    high = probs.to(q.dtype)
    low = probs.sub_(high).to(q.dtype)
    return _matmul_f32(high, kv[1]).add_(_matmul_f32(low, kv[1]))


def _layer(x, w_qkv, w_o, num_heads, scale, causal, group):
    b, s_l, hidden = x.shape
    d = w_qkv.shape[0] // (3 * num_heads)
    scale = scale if scale is not None else d**-0.5
    qkv = (x.view(b * s_l, hidden) @ w_qkv.T).view(b, s_l, 3, num_heads, d)
    ctx = _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale, causal, group)
    ctx = ctx.to(x.dtype).view(b, num_heads, s_l, d).permute(0, 2, 1, 3).reshape(b * s_l, num_heads * d)
    return (ctx @ w_o.T).view(b, s_l, w_o.shape[0])


def solution(hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False):
    cp_group, pp_group = _groups()
    stage = dist.get_rank(pp_group)
    peer = dist.get_process_group_ranks(pp_group)[1 - stage]
    if stage == 0:
        y = _layer(hidden_states, w_qkv, w_o, num_heads, softmax_scale, causal, cp_group)
        dist.send(y, peer)
        return y
    x = torch.empty_like(hidden_states)
    dist.recv(x, peer)
    return _layer(x, w_qkv, w_o, num_heads, softmax_scale, causal, cp_group)


def traffic(ctx):
    """Per GPU, each direction: W/2 - 1 blocks over its stage's CP group, one block between stages.

    CP (each stage): rank c needs the keys and values of the earlier blocks. It can receive them
    (2 hidden values per token), the layer inputs of those blocks and project them itself (hidden
    per token, less), or send its queries out and take partial outputs and log-sum-exps back (more);
    every rank can be given the same W/2 - 1 blocks in and out. PP: stage 1 needs y0, one block of
    its tokens (sending stage 0's input and weights instead is more). Rounds: a CP round in each
    stage (W > 2) and the PP send between them. FLOPs: one layer per GPU, the QKV and O GEMMs of its
    block and the causal half of the attention split evenly over the stage. Memory: read the inputs,
    write the output.
    """
    w = ctx.world_size
    b, s, hidden, heads = ctx.size["batch"], ctx.size["seq"], ctx.size["hidden"], ctx.size["heads"]
    n_cp = w // N_PP
    tokens = b * s // n_cp
    isz = ctx.dtype.itemsize
    block = tokens * hidden * isz
    d = hidden // heads
    return {
        "nvlink_bytes": (n_cp - 1) * block + block,
        "hbm_bytes": (2 * tokens * hidden + 4 * hidden * hidden) * isz,
        "flops": 8 * tokens * hidden * hidden + 2 * b * heads * d * s * s / n_cp,  # QKV + O, attention
        "rounds": 3 if n_cp > 1 else 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): our inputs, then
# the cached CP and PP groups.
ORIGINAL = {
    "signature": (
        "solution(hidden_states: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor, num_heads: int, "
        "softmax_scale: Optional[float] = None, causal: bool = False, "
        "cp_group: Optional[dist.ProcessGroup] = None, pp_group: Optional[dist.ProcessGroup] = None) "
        "-> torch.Tensor"
    ),
    "groups": lambda env: dict(zip(("cp", "pp"), _groups(), strict=True)),
    "args": lambda inputs, env: (*inputs, env.groups["cp"], env.groups["pp"]),
    "differences": (
        "Seeds derive from the trial's secret (the original's come from offsets of an older numbering) "
        "and the world-size rule (even W: PP = 2 outermost, CP = W/2 dividing seq) is checked. `pkb` "
        "keeps the original's per-rank shapes at W = 8; `large` is a 4096-token sequence. Each stage "
        "returns its own output (y0 on stage 0, y1 on stage 1). The sequence is split contiguously "
        "(not zigzag); the reference uses one all-gather instead of a ring of sends."
    ),
}
