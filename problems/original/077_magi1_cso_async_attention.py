"""The original benchmark's problem 77, exactly: MAGI-1's context-shuffled attention, head-parallel.

As the original's input builder makes them (a seed per rank): R = 4 ranges of chunk_token_nums = N
tokens (N = 12150 with Hq = 24 query heads at W <= 4, N = 21600 with Hq = 48 above; Hq rounded down
to a multiple of W where W does not divide it; Hkv = 8 key/value heads, or W where neither of 8 and W
divides the other); rank r holds n = ceil(N / W) tokens of each range, range-major: query [4 n, Hq,
128] and key_value [4 n, Hkv, 256] (keys then values), bf16 standard normal; k_ranges [[i N, (i+1) N]]
int64, the same on every rank. Called as solution(query, key_value, k_ranges, 4, N, None). An
all-to-all gives each rank its Hq / W query heads and Hkv / W key/value heads (key/value heads
repeated first where Hkv < W) of every rank's tokens; range i's W n queries (rank-major) attend,
without a mask, scale 128 ** -0.5, query head h to key/value head h // (Hq / Hkv), to the keys
k_ranges[i] of the ranges' tokens clipped to the first N of each range; an all-to-all returns the
outputs: every rank returns [4 n, Hq, 128] bf16. Judged as the original harness judges: atol = rtol
= 1e-2, no norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md).

On CPU (the tests' machine: 2 cores) one call at the original's size takes many minutes (about 1
TFLOP of attention per rank at W = 2), so on a CPU device N is cpu_chunk_tokens (61, which W = 2 and 4
do not divide, so that the clipping is exercised) instead: the same heads and layout.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 77
NAME = "magi1_cso_async_attention"
CATEGORY = "CP"
SOURCE = "MAGI-1 context-shuffle overlap attention (head-parallel all-to-all per range)"
SUMMARY = "GQA over 4 context-shuffled ranges of 12150 tokens (21600 at W > 4), bf16; all-to-all to heads."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 (heads adjusted to W as the original adjusts them)"
SIZES = {
    "pkb": {
        "ranges": 4,
        "head_dim": 128,
        "kv_heads": 8,
        # (q_heads, chunk_token_nums) at W <= 4 and above
        "small_world": [24, 12150],
        "large_world": [48, 21600],
        "cpu_chunk_tokens": 61,
    }
}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def shape(world_size, size, device_type):
    """The original's (q_heads, kv_heads, chunk_token_nums, n) at this world size (N reduced on CPU)."""
    hq, chunk = size["small_world"] if world_size <= 4 else size["large_world"]
    if hq % world_size:
        hq = world_size * max(1, hq // world_size)
    hkv = size["kv_heads"]
    if hkv % world_size and world_size % hkv:
        hkv = world_size
    if device_type == "cpu":
        chunk = size["cpu_chunk_tokens"]
    return hq, hkv, chunk, -(-chunk // world_size)


def make_inputs(ctx):
    """The original's: query, then keys and values, standard normal; each range's own chunk as its
    keys; 4 ranges; clip to N; group None."""
    s = ctx.size
    hq, hkv, chunk, n = shape(ctx.world_size, s, ctx.device.type)
    r, d = s["ranges"], s["head_dim"]
    query = ctx.randn(r * n, hq, d)
    key, value = ctx.randn(r * n, hkv, d), ctx.randn(r * n, hkv, d)
    starts = torch.arange(r, dtype=torch.int64, device=ctx.device) * chunk
    k_ranges = torch.stack([starts, starts + chunk], dim=1)
    return query, torch.cat([key, value], dim=-1), k_ranges, r, chunk, None


def _to_heads(x, w, r, n):
    """[R n, H, E] (this rank's tokens, every head) -> the send buffer [W, R, n, H / W, E]."""
    h, e = x.shape[1:]
    return x.view(r, n, w, h // w, e).permute(2, 0, 1, 3, 4)


@torch.no_grad()
def solution(query, key_value, k_ranges, cp_shuffle_num, clip_token_nums=None, group=None):
    w = dist.get_world_size(group)
    r = cp_shuffle_num
    tokens, hq, d = query.shape
    n = tokens // r
    c = w * n
    clip = int(clip_token_nums or c)
    kv = key_value
    if kv.shape[1] < w:
        kv = kv.repeat_interleave(w // kv.shape[1], dim=1)
    hql, hkvl = hq // w, kv.shape[1] // w
    q_part = _to_heads(query, w, r, n).reshape(w, r, n, hql * d)
    kv_part = _to_heads(kv, w, r, n).reshape(w, r, n, hkvl * 2 * d)
    send = torch.cat([q_part, kv_part], dim=-1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    whole = recv.transpose(0, 1).reshape(r, c, -1)  # every range's tokens, rank-major
    q_all = whole[..., : hql * d].reshape(r, c, hql, d)
    kv_all = whole[:, :clip, hql * d :].reshape(r * clip, hkvl, 2 * d)  # keys: each range clipped to N
    out = torch.empty(r, c, hql, d, dtype=query.dtype, device=query.device)
    for i, (start, end) in enumerate(k_ranges.tolist()):
        keys = kv_all[start:end].repeat_interleave(hql // hkvl, dim=1).transpose(0, 1).unsqueeze(0)
        q = q_all[i].transpose(0, 1).unsqueeze(0)  # [1, H, C, D]
        out[i] = F.scaled_dot_product_attention(q, keys[..., :d], keys[..., d:]).squeeze(0).transpose(0, 1)
    send = out.view(r, w, n, hql, d).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(tokens, hq, d)


def traffic(ctx):
    """Per GPU, the least of pkb's two schedules (problems/077): head-parallel, (W - 1)/W of the
    rank's query and key_value out and of its output back; or token-parallel, the other W - 1 ranks'
    key_value of each range. FLOPs: every range's W n queries against its N keys, split over the
    ranks. Memory: query and key_value read, the output written."""
    w, s = ctx.world_size, ctx.size
    hq, hkv, chunk, n = shape(w, s, ctx.device.type)
    r, d = s["ranges"], s["head_dim"]
    item = ctx.dtype.itemsize
    q_bytes = r * n * hq * d * item
    kv_bytes = r * n * max(hkv, w) * 2 * d * item
    return {
        "nvlink_bytes": min((w - 1) / w * (2 * q_bytes + kv_bytes), (w - 1) * r * n * hkv * 2 * d * item),
        "hbm_bytes": 2 * q_bytes + r * n * hkv * 2 * d * item,
        "flops": r * 4 * d * w * n * chunk * hq / w,
        "rounds": 1,
    }
