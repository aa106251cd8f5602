"""Problem 25 in float64: the logits and their log-softmax in float64 from the same bf16 inputs, the
ranks' sums and extremes in one float64 all-gather. A more precise correct solution: it must pass
(it measures the tolerance)."""

import torch
import torch.distributed as dist


def solution(hidden_states, weight, labels, old_logprobs, advantages, ignore_index=-100):
    logits = hidden_states.double() @ weight.double().T
    valid = labels != ignore_index
    safe = labels.clamp(min=0)
    lp = logits.log_softmax(dim=-1).gather(1, safe[:, None])[:, 0].masked_fill(~valid, 0.0)
    delta = (lp - old_logprobs.double()).masked_fill(~valid, 0.0).clamp(-20.0, 20.0)
    ratio = delta.exp()
    pg = -(ratio * advantages.double()).masked_fill(~valid, 0.0)
    mine = torch.stack(
        [
            valid.sum().double(),
            pg.sum(),
            ratio[valid].sum(),
            (ratio - delta - 1.0)[valid].sum(),
            -lp[valid].sum(),
            ratio.masked_fill(~valid, float("inf")).min(),
            ratio.masked_fill(~valid, float("-inf")).max(),
        ]
    )
    every = mine.new_empty(dist.get_world_size() * 7)  # flat: gloo gathers only into a flat buffer
    dist.all_gather_into_tensor(every, mine)
    every = every.view(-1, 7)
    n = every[:, 0].sum().clamp(min=1.0)
    sums = every[:, 1:5].sum(dim=0) / n
    metrics = torch.stack([sums[1], every[:, 5].min(), every[:, 6].max(), sums[2], sums[3]])
    return sums[0].float(), None, lp.float(), pg.float(), metrics.float()
