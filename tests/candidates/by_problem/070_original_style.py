"""Problem 70 the way TorchRec's KJTAllToAll reads: one all-to-all of the splits (lengths, ids and
batch size per destination), two asynchronous all-to-alls of the lengths and the ids, then a
`recat` index list that puts the received (rank, feature) segments in feature-major order, applied
one segment at a time. Called as the original harness calls it: (lengths, values, key_splits,
batch_size, None)."""

import torch
import torch.distributed as dist


def _take_segments(data: torch.Tensor, sizes: list[int], order: list[int]) -> torch.Tensor:
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    return torch.cat([data[bounds[i] : bounds[i + 1]] for i in order]) if order else data[:0].clone()


@torch.no_grad()
def solution(
    lengths: torch.Tensor,
    values: torch.Tensor,
    key_splits: list[int],
    batch_size: int,
    pg: dist.ProcessGroup | None = None,
    weights: torch.Tensor | None = None,
    stride_per_key: list[int] | None = None,
    stagger: int = 1,
) -> dict[str, torch.Tensor]:
    pg = pg or dist.group.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    per_feature = [int(x) for x in lengths.view(-1, batch_size).sum(1).tolist()]
    id_splits, first = [], 0
    for k in key_splits:
        id_splits.append(sum(per_feature[first : first + k]))
        first += k
    length_splits = [k * batch_size for k in key_splits]
    meta = torch.tensor(
        [[a, b, batch_size] for a, b in zip(length_splits, id_splits, strict=True)], device=lengths.device
    )
    meta_in = torch.empty_like(meta)
    dist.all_to_all_single(meta_in, meta, group=pg)
    length_recv, id_recv, batches = (meta_in[:, i].tolist() for i in range(3))
    got_lengths = lengths.new_empty(sum(length_recv))
    got_values = values.new_empty(sum(id_recv))
    jobs = [
        dist.all_to_all_single(got_lengths, lengths, length_recv, length_splits, group=pg, async_op=True),
        dist.all_to_all_single(got_values, values, id_recv, id_splits, group=pg, async_op=True),
    ]
    for job in jobs:
        job.wait()
    local = key_splits[rank]
    recat = [f + s * local for f in range(local) for s in range(world)]
    length_sizes = [batches[s] for s in range(world) for _ in range(local)]
    id_sizes = [int(part.sum()) for part in torch.split(got_lengths, length_sizes)]
    return {
        "lengths": _take_segments(got_lengths, length_sizes, recat),
        "values": _take_segments(got_values, id_sizes, recat),
        "stride": torch.tensor(sum(batches), device=lengths.device),
        "stride_per_rank": torch.tensor(batches, device=lengths.device),
    }
