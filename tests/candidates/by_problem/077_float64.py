"""Problem 77 by the token-parallel schedule in float64 (correct: passes): queries stay on their rank;
one all-gather brings every rank's key_value (all heads); each range's rows of this rank attend to the
range's window of global tokens, scores and softmax in float64."""

import torch
import torch.distributed as dist


def solution(query, key_value, k_ranges, cp_shuffle_num, clip_token_nums=None, group=None):
    w = dist.get_world_size(group)
    r = cp_shuffle_num
    tokens, hq, d = query.shape
    n = tokens // r
    c = w * n
    gathered = key_value.new_empty(w * tokens, *key_value.shape[1:])
    dist.all_gather_into_tensor(gathered, key_value, group=group)
    # global order: range, then source rank, then token
    kv = gathered.view(w, r, n, *key_value.shape[1:]).transpose(0, 1).reshape(r * c, *key_value.shape[1:])
    kv = kv.double().repeat_interleave(hq // key_value.shape[1], dim=1)
    out = torch.empty(r, n, hq, d, dtype=torch.float64)
    for i, (start, end) in enumerate(k_ranges.tolist()):
        q = query[i * n : (i + 1) * n].double().transpose(0, 1)  # [H, n, D]
        keys = kv[start:end].transpose(0, 1)  # [H, m, 2D]
        p = torch.softmax(q @ keys[..., :d].transpose(1, 2) * d**-0.5, dim=-1)
        out[i] = (p @ keys[..., d:]).transpose(0, 1)
    return out.reshape(tokens, hq, d).to(query.dtype)
