"""A causal attention layer with tensor parallelism over heads and context parallelism over the sequence.

Ranks form a 2 x (W/2) mesh in Megatron's tp-cp order, TP innermost: rank r has TP index t = r % 2
and CP index c = r // 2. The TP groups are the rank pairs {2c, 2c + 1}; the CP groups are
{t, t + 2, t + 4, ...} (CP index = rank in the CP group). The sequence of S tokens is split into
W/2 contiguous blocks of S_local = S / (W/2) tokens; the two ranks of a TP pair hold the same block.
Rank r holds
  hidden_states  bf16 [B, S_local, hidden]   tokens c*S_local .. (c+1)*S_local - 1 (the same on
                                              both ranks of a TP pair)
  w_qkv          bf16 [3 * hidden / 2, hidden]  its TP shard of the fused QKV projection: the q rows
                                              of its num_heads / 2 heads, then their k rows, then
                                              their v rows (head_dim = hidden / num_heads rows each)
  w_o            bf16 [hidden, hidden / 2]    its TP shard of the output projection: the columns
                                              that read its heads' attention outputs
and num_heads is the whole layer's head count (8 at `pkb`), so each rank has num_heads / 2 heads.

Every rank must return y bf16 [B, S_local, hidden] for its block (the same on both ranks of a TP
pair):
  q, k, v = hidden_states @ w_qkv^T   (its heads; bf16 GEMM, rounded to bf16)
  ctx     = causal attention of q against the keys and values of its CP group's tokens 0 .. its
            last one, with scale = softmax_scale or 1/sqrt(head_dim), in float32, rounded to bf16
  y       = sum over the TP pair of ctx @ w_o^T
The reference projects, all-gathers k and v over the CP group once (ring attention's W/2 - 1 ring
steps deliver the same blocks), computes its rows of the causal attention in one pass with float32
accuracy from bf16 operands (problem 54's method: bf16 products with float32 sums, probabilities
split in two bf16 terms), multiplies by w_o in bf16 and all-reduces the bf16 partials over the TP
pair, as Megatron's row-parallel layer does.

The TP and CP process groups are created once per process, on the first call, and cached
(dist.new_group is collective: every rank creates every group, in the same order). A solution may
do the same: the first call, which is judged, pays for the creation; the timed calls do not.

Inputs: hidden_states standard normal, different per CP block and trial; the weights are drawn once
per trial for the whole layer (the same on every CP rank) as N(0, 1/hidden), the q rows times 2 (as
problem 54 scales q, so each softmax is peaked enough that the output does not average out at long
sequences), w_o times 2; every TP rank gets its shard.

Source: ring-flash-attention's ring attention inside a Megatron-style TP attention layer
(ParallelKernelBench problem 55). A file written for the original gets its call (hidden_states,
w_qkv, w_o, num_heads, None, True, tp_group, cp_group) with the cached groups (ORIGINAL). Our
signature is the original's without the two groups: a solution makes its groups itself, once, in
the layout above, so that a process-group argument cannot stand for the layout it must follow.

Differences from the original: the original draws its inputs from seed offsets left over from an
older numbering of its problems and leaves its world-size rule implicit; here the seeds derive from
the trial's secret and the rule (an even world size, TP = 2, CP = W/2 dividing seq) is checked.
`pkb` keeps the original's per-rank shapes at W = 8 (16 tokens, 4 per CP rank); `large` is a real
sequence. The sequence is split contiguously (not zigzag); the reference uses one all-gather instead
of a ring of sends. num_heads is the layer's head count, not the TP rank's.
"""

import torch
import torch.distributed as dist

ID = 55
NAME = "ring_attention_tp"
CATEGORY = "CP+TP"
SOURCE = "ring-flash-attention ring attention in a Megatron TP attention layer (tp-cp order)"
SUMMARY = "Causal attention layer (QKV, attention, O), heads split over TP = 2, sequence over CP = W/2."
DTYPE = "bfloat16"
WORLD_SIZES = "even world size >= 2 (TP = 2 x CP = W/2, TP innermost) with W/2 dividing seq"
N_TP = 2
SIZES = {
    # batch: sequences; seq: tokens of the whole sequence (split over the CP group); hidden: model
    # width; heads: the layer's heads (split over the TP pair), head_dim = hidden / heads
    "pkb": {"batch": 16, "seq": 16, "hidden": 512, "heads": 8},
    # At W = 2 (CP = 1) each rank scores 8192 queries against 8192 keys in its 8 heads: 2 GiB of
    # float32 scores and some 25 GiB of HBM traffic over the passes on them (scores, mask, softmax,
    # the two bf16 terms), about 6 ms at H200's 4.3 TB/s; the GEMMs (3.4e10 FLOP) are minor. At
    # W = 4 the last CP rank has half of that. An estimate until measured.
    "large": {"batch": 1, "seq": 8192, "hidden": 1024, "heads": 16},
}
# y: RMS about 1.4 at `pkb` (float64, one layer as in problem 56 with q scaled by 2). Correct
# solutions differ in rounding: a float32 TP sum instead of the bf16 all-reduce, q, k, v or ctx kept
# in float32, bf16 probabilities (flash attention) instead of two terms. Measured on CPU (W = 2, 4;
# 5 trials): a float64 solution (tests/candidates/by_problem/055_float64.py) differs from the reference
# by up to 0.0312 (relative norm <= 0.0047); one with flash attention's bf16 probabilities
# (055_bf16_probs.py; 4 trials) by up to 0.0625 (relative norm <= 0.004). atol 0.1 admits the
# latter near zero; at long sequences outputs are smaller (RMS about 0.35 at 4096 tokens, float64
# estimate) and the relative norm binds.
TOLERANCE = {"atol": 0.1, "rtol": 0.03, "rel_norm": 0.015}
Q_SCALE = 2.0
O_SCALE = 2.0

_GROUPS = {}  # world size -> (TP group, CP group) of this rank
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_bmm_out_dtype = [True]  # whether torch.bmm takes out_dtype on this build (CUDA, torch >= 2.8)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2 or world_size % N_TP:
        return "needs an even world size (TP = 2 x CP = W/2)"
    n_cp = world_size // N_TP
    if size["seq"] % n_cp:
        return f"seq = {size['seq']} is not divisible by the CP size W/2 = {n_cp}"
    if size["hidden"] % size["heads"] or size["heads"] % N_TP:
        return "heads must divide hidden and be even"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): seq a multiple of the
    CP size W/2, an even head count (split over the TP pair), head_dim 16 to 128 in 16s; short sequences."""
    n_cp = max(1, world_size // N_TP)
    heads = draw("heads", 2, 16, 2)
    return {
        "batch": draw("batch", 1, 16),
        "seq": draw("seq", 2 * n_cp, max(32, 4 * n_cp), n_cp),
        "hidden": draw("hidden", 16 * heads, min(max(768, 32 * heads), 128 * heads), 16 * heads),
        "heads": heads,
    }


def _groups():
    """This rank's (TP group, CP group), created on the first call and cached."""
    w = dist.get_world_size()
    if w not in _GROUPS:
        n_cp = w // N_TP
        rank = dist.get_rank()
        tp_group = cp_group = None
        for c in range(n_cp):
            g = dist.new_group([c * N_TP + t for t in range(N_TP)])
            if rank // N_TP == c:
                tp_group = g
        for t in range(N_TP):
            g = dist.new_group([c * N_TP + t for c in range(n_cp)])
            if rank % N_TP == t:
                cp_group = g
        _GROUPS[w] = (tp_group, cp_group)
    return _GROUPS[w]


def make_inputs(ctx):
    """Our call: (hidden_states, w_qkv, w_o, num_heads, None, True), the original's without its groups."""
    b, s, hidden, heads = ctx.size["batch"], ctx.size["seq"], ctx.size["hidden"], ctx.size["heads"]
    n_cp = ctx.world_size // N_TP
    t, c = ctx.rank % N_TP, ctx.rank // N_TP
    half = hidden // N_TP
    x = ctx.randn(n_cp, b, s // n_cp, hidden, shared=True)[c].clone()
    w_qkv = ctx.randn(3, hidden, hidden, shared=True, scale=hidden**-0.5)
    w_qkv[0] *= Q_SCALE
    w_qkv = w_qkv.view(3, N_TP, half, hidden)[:, t].reshape(3 * half, hidden).clone()
    w_o = ctx.randn(hidden, hidden, shared=True, scale=O_SCALE * hidden**-0.5)[:, t * half : (t + 1) * half]
    return x, w_qkv, w_o.clone(), heads, None, True


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


def solution(hidden_states, w_qkv, w_o, num_heads, softmax_scale=None, causal=False):
    tp_group, cp_group = _groups()
    n_tp = dist.get_world_size(tp_group)
    b, s_l, hidden = hidden_states.shape
    h = num_heads // n_tp
    d = w_qkv.shape[0] // (3 * h)
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    qkv = (hidden_states.view(b * s_l, hidden) @ w_qkv.T).view(b, s_l, 3, h, d)
    ctx = _attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale, causal, group=cp_group)
    ctx = ctx.to(hidden_states.dtype).view(b, h, s_l, d).permute(0, 2, 1, 3).reshape(b * s_l, h * d)
    y = ctx @ w_o.T
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=tp_group)
    return y.view(b, s_l, hidden)


def traffic(ctx):
    """Per GPU, each direction: W/2 - 1 blocks of hidden states over the CP group, one TP exchange.

    CP: rank c needs the keys and values of the earlier blocks for its heads. It can receive them
    (2 * hidden/2 values per token), the hidden states of those blocks and project them itself
    (hidden per token, the same), or send its queries out and take partial outputs and log-sum-exps
    back (more); every rank can be given the same W/2 - 1 blocks in and out. TP: the pair must
    combine its halves: all-reduce the partial outputs (one output block each way), or swap
    attention outputs and w_o shards (half a block + hidden^2/2), or swap weight shards and compute
    every head on both ranks (2 hidden^2, no activations); the least of the three. Rounds: one CP
    round (W > 2) and one TP round. FLOPs: the split-head schedule, QKV and O GEMMs of the rank's
    heads and the causal half of the attention split evenly over the CP group. Memory: read the
    inputs, write the output.
    """
    w = ctx.world_size
    b, s, hidden, heads = ctx.size["batch"], ctx.size["seq"], ctx.size["hidden"], ctx.size["heads"]
    n_cp = w // N_TP
    tokens = b * s // n_cp
    isz = ctx.dtype.itemsize
    block = tokens * hidden * isz
    half = hidden // N_TP
    tp = min(block, (tokens * half + hidden * half) * isz, 2 * hidden * hidden * isz)
    d = hidden // heads
    return {
        "nvlink_bytes": (n_cp - 1) * block + tp,
        "hbm_bytes": (2 * tokens * hidden + 4 * hidden * half) * isz,
        "flops": 2 * tokens * hidden * 3 * half
        + 2 * b * (heads // N_TP) * d * s * s / n_cp
        + 2 * tokens * half * hidden,
        "rounds": 2 if n_cp > 1 else 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): our inputs, then
# the cached TP and CP groups.
ORIGINAL = {
    "signature": (
        "solution(hidden_states: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor, num_heads: int, "
        "softmax_scale: Optional[float] = None, causal: bool = False, "
        "tp_group: Optional[dist.ProcessGroup] = None, cp_group: Optional[dist.ProcessGroup] = None) "
        "-> torch.Tensor"
    ),
    "groups": lambda env: dict(zip(("tp", "cp"), _groups(), strict=True)),
    "args": lambda inputs, env: (*inputs, env.groups["tp"], env.groups["cp"]),
    "differences": (
        "Seeds derive from the trial's secret (the original's come from offsets of an older numbering) "
        "and the world-size rule (even W: TP = 2 innermost, CP = W/2 dividing seq) is checked. `pkb` "
        "keeps the original's per-rank shapes at W = 8; `large` is an 8192-token sequence. num_heads "
        "is the layer's head count. The sequence is split contiguously (not zigzag); the reference "
        "uses one all-gather instead of a ring of sends."
    ),
}
