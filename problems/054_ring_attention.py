"""Causal attention over a sequence split across ranks (context parallelism, ring-attention layout).

The sequence of S = W * S_local tokens is split into W contiguous blocks: rank r holds tokens
r*S_local .. (r+1)*S_local - 1 of the queries, keys and values, q, k, v bf16 [B, S_local, H, D]
(ring-flash-attention's [batch, seqlen, heads, head_dim] layout). Every rank must return its block of
the attention output, bf16 [B, S_local, H, D]:

  out[i] = sum over keys j <= i (all keys when causal is False) of softmax_j(q_i . k_j * scale) v_j,

with scale = softmax_scale, or 1/sqrt(D) when it is None: attention in float32 (the products of bf16
values are exact in float32; scores, softmax and the weighted sum of v in float32), the result rounded
to bf16 once. The reference gets float32 accuracy from bf16 tensor cores: every product takes bf16
operands with float32 sums, and the probabilities enter the product with v as two bf16 terms (p = hi +
lo, |lo| <= 2^-9 |p|), so that their rounding is 2^-17 rather than flash attention's 2^-9.

With causal attention, rank r needs the keys and values of ranks 0..r. Ring attention passes the key
and value blocks around a ring in W - 1 steps and merges partial results by their log-sum-exp; the
reference instead all-gathers the key and value blocks once and computes the rank's rows of the causal
attention in one pass (scores against its r + 1 blocks, the diagonal block masked): the same result,
one collective, no merge.

Inputs: q, k, v standard normal, different on every rank and in every trial; q is scaled by 2 so each
query's softmax is peaked enough for its output not to vanish at long sequences (with unit scores the
average over thousands of keys shrinks towards 0): RMS about 0.1-0.2 at 8192 tokens, O(1) at 16.

Source: ring-flash-attention (zhuzilin/ring-flash-attention: RingComm, LSE merge), causal
(ParallelKernelBench problem 54). The signature and the call (q, k, v, None, True, None) are the
original's; group None is the default group.

Differences from the original: `pkb` keeps the original's 16 tokens (2 per rank at W = 8), which is
pure latency; `large` is a real sequence (8192 tokens). The sequence is split contiguously (the plain
ring layout, not zigzag); the reference uses one all-gather instead of a ring of sends.
"""

import torch
import torch.distributed as dist

ID = 54
NAME = "ring_attention"
CATEGORY = "CP/ring"
SOURCE = "ring-flash-attention (ring attention with log-sum-exp merge)"
SUMMARY = "Causal attention of bf16 q, k, v [B, S/W, H, D] whose sequence is split over ranks in blocks."
DTYPE = "bfloat16"
WORLD_SIZES = "world size >= 2 dividing seq"
SIZES = {
    # batch, heads, head_dim: per token; seq: the whole sequence, split evenly across ranks
    "pkb": {"batch": 16, "seq": 16, "heads": 8, "head_dim": 64},
    # rank W-1 (the most work under the causal mask) scores 4096 queries against 8192 keys in 16 heads
    # at W = 2: 2 GiB of float32 scores, several passes over them, a few ms on an H200 (an estimate
    # until measured)
    "large": {"batch": 1, "seq": 8192, "heads": 16, "head_dim": 64},
}
# Outputs are bf16, O(1) at `pkb`, RMS 0.1-0.2 at `large`. Float32 solutions differ from the reference
# by the output's rounding: measured on CPU (W = 2, 4; 3 trials), a float64 one and a float32 ring with
# log-sum-exp merges differ by one bf16 unit in the last place at most (max abs 0.0156 on outputs near
# 3, relative norm <= 1.6e-4).
# Rounding the probabilities to bf16 before the product with v, as flash attention does, moves an
# output by up to 2^-9 of the sum of |p v| over its keys (max abs 0.0156, relative norm <= 2.8e-3):
# the tolerance admits it. At `large` these errors are ~10x smaller and the relative norm is the
# binding check.
TOLERANCE = {"atol": 0.03, "rtol": 0.02, "rel_norm": 0.01}
Q_SCALE = 2.0

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_bmm_out_dtype = [True]  # whether torch.bmm takes out_dtype on this build (CUDA, torch >= 2.8)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["seq"] % world_size:
        return f"seq = {size['seq']} is not divisible by the world size {world_size}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any batch and heads,
    seq a multiple of W (split over the ranks), head_dim a multiple of 16; sequences kept short."""
    return {
        "batch": draw("batch", 1, 16),
        "seq": draw("seq", world_size, max(48, 4 * world_size), world_size),
        "heads": draw("heads", 1, 16),
        "head_dim": draw("head_dim", 16, 128, 16),
    }


def make_inputs(ctx):
    """The original's call: this rank's q, k, v [B, S/W, H, D], then softmax_scale None, causal True,
    group None."""
    b, h, d = ctx.size["batch"], ctx.size["heads"], ctx.size["head_dim"]
    s_local = ctx.size["seq"] // ctx.world_size
    q = ctx.randn(b, s_local, h, d, scale=Q_SCALE)
    k = ctx.randn(b, s_local, h, d)
    v = ctx.randn(b, s_local, h, d)
    return q, k, v, None, True, None


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


def solution(q, k, v, softmax_scale=None, causal=False, group=None):
    w = dist.get_world_size(group)
    rank = dist.get_rank(group)
    b, s_local, h, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d**-0.5

    # every rank's k and v: [W, 2, B, S_local, H, D]
    local = torch.stack([k, v])
    gathered = local.new_empty(w * 2, b, s_local, h, d)
    _all_gather(gathered, local, group=group)
    blocks = rank + 1 if causal else w
    kv = gathered.view(w, 2, b, s_local, h, d)[:blocks]
    # [2, B*H, blocks*S_local, D]: heads as the batch of the matrix products
    kv = kv.permute(1, 2, 4, 0, 3, 5).reshape(2, b * h, blocks * s_local, d)
    qh = q.permute(0, 2, 1, 3).reshape(b * h, s_local, d)

    scores = _matmul_f32(qh, kv[0].transpose(1, 2)).mul_(scale)  # [B*H, S_local, keys] float32
    if causal:
        diagonal = scores[:, :, rank * s_local :]
        above = torch.ones(s_local, s_local, dtype=torch.bool, device=q.device).triu_(1)
        diagonal.masked_fill_(above, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    high = probs.to(q.dtype)
    low = probs.sub_(high).to(q.dtype)  # what bf16 rounding left out of each probability
    out = _matmul_f32(high, kv[1]).add_(_matmul_f32(low, kv[1]))  # [B*H, S_local, D] float32
    return out.to(q.dtype).view(b, h, s_local, d).transpose(1, 2).contiguous()


def traffic(ctx):
    """Per GPU, each direction: W - 1 query blocks out and W - 1 partial outputs (+ log-sum-exp) back.

    The last rank needs every other block's contribution. Either the W - 1 key and value blocks come to
    it (2 blocks each), or its query block goes to each other rank and a bf16 partial output and a
    float32 log-sum-exp per query and head come back (1 block + 1/32 each way at D = 64); the second
    moves less, and every rank can be given the same (W - 1) blocks in and out. The latency term counts
    one round (the key/value schedule needs one; bytes and rounds are each a lower bound).
    FLOPs: the causal half of QK^T and PV, split evenly (a balanced schedule), 2 B H D S^2 / W
    (twice that without the mask). Memory: read q, k, v and write the output once.
    """
    w = ctx.world_size
    b, s, h, d = ctx.size["batch"], ctx.size["seq"], ctx.size["heads"], ctx.size["head_dim"]
    s_local = s // w
    block = b * s_local * h * d * ctx.dtype.itemsize
    lse = b * s_local * h * 4
    return {
        "nvlink_bytes": (w - 1) * (block + lse),
        "hbm_bytes": 4 * block,
        "flops": 2 * b * h * d * s * s / w,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": "solution(q, k, v, softmax_scale=None, causal=False, group=None)",
    "args": lambda inputs, env: inputs,
    "differences": (
        "`pkb` keeps the original's 16 tokens (2 per rank at W = 8), which is pure latency; `large` is a "
        "real sequence (8192 tokens). The sequence is split contiguously (the plain ring layout, not "
        "zigzag); the reference uses one all-gather instead of a ring of sends."
    ),
}
