"""Problem 60 as PhysicsNeMo's DistributedIRFFT2 does it: zero-pad the last dim to L, fill the
padding with the conjugate mirror of the spectrum, all-gather the padded rows to mirror them along
the first dim and keep this rank's, inverse FFT along L, list all-to-all of the column blocks,
inverse FFT along H, real part. Called as the original harness calls it:
(x, (H, L), (-2, -1), "ortho", None)."""

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _hermitian_rows(x: torch.Tensor, length: int, group) -> torch.Tensor:
    """x [..., rows, L // 2 + 1] -> this rank's rows of the completed spectrum [..., rows, L]."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    given = x.shape[-1]
    padded = F.pad(x, (0, length - given))
    padded[..., given:] = torch.flip(padded[..., 1 : length - given + 1].conj(), dims=[-1])
    every = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(every, padded, group=group)
    whole = torch.cat(every, dim=-2)
    whole[..., 1:, given:] = torch.flip(whole[..., 1:, given:], dims=[-2])
    return whole.chunk(world, dim=-2)[rank].contiguous()


@torch.no_grad()
def solution(
    x: torch.Tensor,
    s: Sequence[int] | None,
    dim: Sequence[int],
    norm: str = "ortho",
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    group = group or dist.group.WORLD
    world = dist.get_world_size(group)
    rows, length = (int(s[0]), int(s[1])) if s is not None else (x.shape[-2], 2 * (x.shape[-1] - 1))
    assert tuple(d % x.dim() for d in dim) == (x.dim() - 2, x.dim() - 1)
    spectrum = _hermitian_rows(x, length, group)
    partial = torch.fft.ifft(spectrum, n=length, dim=-1, norm=norm)
    pieces = [p.contiguous() for p in partial.chunk(world, dim=-1)]
    incoming = [torch.empty_like(pieces[0]) for _ in range(world)]
    dist.all_to_all(incoming, pieces, group=group)
    columns = torch.cat(incoming, dim=-2)
    return torch.real(torch.fft.ifft(columns, n=rows, dim=-2, norm=norm)).contiguous()
