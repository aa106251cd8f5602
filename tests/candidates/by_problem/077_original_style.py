"""Problem 77 written as a file for the original benchmark would be (our own code): MAGI-1's
context-shuffle overlap attention, called with the original's (query, key_value, k_ranges,
cp_shuffle_num, clip_token_nums, None).

The key/values go head-parallel in one all-to-all; then per range an asynchronous all-to-all of the
next range's queries is in flight while the current range's attention runs, and each range's output
goes back asynchronously; keys clipped to clip_token_nums per range. It must pass unchanged.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _a2a(x, group, async_op=False):
    out = torch.empty_like(x)
    work = dist.all_to_all_single(out, x.contiguous(), group=group, async_op=async_op)
    return (out, work) if async_op else out


@torch.no_grad()
def solution(
    query: torch.Tensor,
    key_value: torch.Tensor,
    k_ranges: torch.Tensor,
    cp_shuffle_num: int,
    clip_token_nums: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    group = group or dist.group.WORLD
    w = dist.get_world_size(group)
    ranges = cp_shuffle_num
    tokens, hq, d = query.shape
    spb = tokens // ranges
    clip = int(clip_token_nums or w * spb)
    kv = key_value
    if kv.shape[1] < w:
        kv = kv.repeat_interleave(w // kv.shape[1], dim=1)
    hkv = kv.shape[1] // w
    kv = _a2a(kv.view(tokens, w, hkv, 2 * d).transpose(0, 1).reshape(w * tokens, hkv, 2 * d), group)
    kv = kv.view(w, ranges, spb, hkv, 2 * d).transpose(0, 1).reshape(ranges, w * spb, hkv, 2 * d)
    kv = kv[:, :clip].reshape(ranges * clip, hkv, 2 * d)
    hl = hq // w
    chunks = query.view(ranges, spb, w, hl, d).transpose(1, 2).reshape(ranges, w * spb, hl, d)
    pending = _a2a(chunks[0], group, async_op=True)
    sent = []
    for i in range(ranges):
        q_local, work = pending
        work.wait()
        if i + 1 < ranges:
            pending = _a2a(chunks[i + 1], group, async_op=True)
        start, end = int(k_ranges[i, 0]), int(k_ranges[i, 1])
        keys = kv[start:end].repeat_interleave(hl // hkv, dim=1)
        o = F.scaled_dot_product_attention(
            q_local.transpose(0, 1)[None],
            keys[..., :d].transpose(0, 1)[None],
            keys[..., d:].transpose(0, 1)[None],
        )
        sent.append(_a2a(o[0].transpose(0, 1), group, async_op=True))
    outs = []
    for out, work in sent:
        work.wait()
        outs.append(out)
    out = torch.stack(outs).view(ranges, w, spb, hl, d).permute(0, 2, 1, 3, 4)
    return out.reshape(tokens, hq, d)
