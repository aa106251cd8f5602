"""Problem 72 without all-to-alls and in float64: all-gather x1, x2 and v over the sequence, undo the
zigzag order, convolve every channel with its group's filter in float64 (FFT of size 2L: exact to
~1e-15), keep this rank's positions, gate with x1 in float64, round once to bf16. It measures how far
the bf16/float32 reference is from exact; it must pass. `causal_conv` is checked against a direct
convolution in the tests."""

import torch
import torch.distributed as dist


def causal_conv(z: torch.Tensor, h: torch.Tensor, group_dim: int) -> torch.Tensor:
    """y[b, c, t] = sum over s <= t of h[c // group_dim, s] * z[b, c, t - s], in float64."""
    seq = z.shape[-1]
    n = 2 * seq
    k = torch.fft.rfft(h.double(), n=n).repeat_interleave(group_dim, dim=0)
    return torch.fft.irfft(torch.fft.rfft(z.double(), n=n) * k, n=n)[..., :seq]


def _natural_positions(world: int, seq_local: int, zigzag: bool) -> torch.Tensor:
    """For each rank-major position (rank r's positions, in its order), its natural position."""
    if not zigzag:
        return torch.arange(world * seq_local)
    half = seq_local // 2
    chunks = []
    for r in range(world):
        chunks += [r, 2 * world - 1 - r]
    return torch.cat([torch.arange(c * half, (c + 1) * half) for c in chunks])


def solution(
    x1_seq, x2_seq, v_seq, h, conv_bias, num_groups, group_dim, group=None, with_zigzag_splitting=True
):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    seq_local = x1_seq.shape[-1]
    full = []
    for t in (x1_seq, x2_seq, v_seq):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous(), group=group)
        rank_major = torch.cat(parts, dim=-1).double()
        natural = torch.empty_like(rank_major)
        natural[..., _natural_positions(world, seq_local, with_zigzag_splitting)] = rank_major
        full.append(natural)
    x1, x2, v = full
    z = x2 * v
    y = causal_conv(z, h, group_dim) + conv_bias.double().view(1, -1, 1) * z
    mine = _natural_positions(world, seq_local, with_zigzag_splitting)[
        rank * seq_local : (rank + 1) * seq_local
    ]
    out = x1[..., mine] * y[..., mine]  # [B, D, seq_local]
    return out.transpose(1, 2).contiguous().to(x1_seq.dtype)
