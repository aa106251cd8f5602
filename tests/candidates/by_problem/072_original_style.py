"""Problem 72 the way Savanna's Hyena operator runs it, in the original benchmark's convention: three
sequence-to-channel all-to-alls (rank-major copy, all_to_all_single, undo the zigzag by an inverse
index), the rank's filter rows and bias, the filter repeated per channel, an FFT convolution scaled
as Savanna's fftconv does (filter spectrum / n, inverse with norm="forward"), gating, one all-to-all
back, and the result returned as the transposed view "b d l -> b l d". Called as the original harness
calls it: (x1, x2, v, h, conv_bias, num_groups, group_dim, None, True)."""

import torch
import torch.distributed as dist


def _zigzag(num_chunks: int, device) -> torch.Tensor:
    half = num_chunks // 2
    idx = torch.empty(num_chunks, dtype=torch.long, device=device)
    idx[0::2] = torch.arange(half, device=device)
    idx[1::2] = torch.arange(num_chunks - 1, half - 1, -1, device=device)
    return idx


def _split_to_full(x: torch.Tensor, group, zigzag: bool) -> torch.Tensor:
    world = dist.get_world_size(group)
    b, d, l_local = x.shape
    send = x.reshape(b, world, d // world, l_local).permute(1, 0, 2, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    full = recv.permute(1, 2, 0, 3).reshape(b, d // world, world * l_local).contiguous()
    if zigzag:
        n = 2 * world
        inverse = torch.argsort(_zigzag(n, x.device))
        full = full.reshape(b, d // world, n, -1).index_select(2, inverse).reshape(b, d // world, -1)
    return full


def _full_to_split(x: torch.Tensor, group, zigzag: bool) -> torch.Tensor:
    world = dist.get_world_size(group)
    b, d, length = x.shape
    if zigzag:
        n = 2 * world
        x = x.reshape(b, d, n, length // n).index_select(2, _zigzag(n, x.device)).reshape(b, d, length)
    send = x.reshape(b, d, world, length // world).permute(2, 0, 1, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3).reshape(b, world * d, length // world).contiguous()


def _fftconv(u: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    seqlen = u.shape[-1]
    fft_size = 2 * seqlen
    k_f = torch.fft.rfft(k, n=fft_size) / fft_size
    u_f = torch.fft.rfft(u.to(dtype=k.dtype), n=fft_size)
    y = torch.fft.irfft(u_f * k_f, n=fft_size, norm="forward")[..., :seqlen]
    return y + u * bias.unsqueeze(-1)


def solution(
    x1_seq: torch.Tensor,
    x2_seq: torch.Tensor,
    v_seq: torch.Tensor,
    h: torch.Tensor,
    conv_bias: torch.Tensor,
    num_groups: int,
    group_dim: int,
    group: dist.ProcessGroup | None = None,
    with_zigzag_splitting: bool = True,
) -> torch.Tensor:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    x1, x2, v = (_split_to_full(t, group, with_zigzag_splitting) for t in (x1_seq, x2_seq, v_seq))
    local_groups = num_groups // world
    h_local = h[rank * local_groups : (rank + 1) * local_groups]
    local_width = x1.shape[1]
    bias_local = conv_bias[rank * local_width : (rank + 1) * local_width]
    h_local = h_local.repeat_interleave(group_dim, dim=-2)
    z = x2 * v
    z = _fftconv(z.to(torch.float32), h_local.to(torch.float32), bias_local.to(torch.float32))
    z = x1 * z.to(v.dtype)
    z = _full_to_split(z, group, with_zigzag_splitting)
    return z.transpose(1, 2)
