"""Problem 72 (hyena_forward_cp): gate before the all-to-all, two all-to-alls instead of four, pipelined.

The reference (like Savanna) moves x1, x2 and v from the sequence split to the channel split (three
all-to-alls), gates there, convolves, gates with x1 and moves the result back (a fourth). But both
gates are elementwise, and an all-to-all only permutes elements, so they commute with it:

1. z = x2 * v is computed in the sequence layout, by one kernel that writes straight into the
   rank-major send buffer (the gate and the layout change in one pass, rounded to bf16 as the
   reference rounds it); one all-to-all moves z instead of three moving x1, x2 and v;
2. on the channel split, z is unzigzagged straight into a zero-padded float32 buffer of length 2L
   (no separate cast and no padding copy before the FFT), convolved with the rank's filters (FFT
   of each group's filter once, broadcast over its channels) and the bias term added: r = bf16(y),
   exactly the reference's pre-gate value;
3. r goes back (the second all-to-all) and x1 never moves: the final gate x1 * r is one kernel that
   reads x1 in its [B, D, s] layout and writes the output channels last.

So half the NVLink bytes (2 (W-1)/W of a [B, D, s] tensor instead of 4), and about a third of the
reference's copies. The channels are also cut into chunks (by whole filter groups) when the tensors
are large: every chunk's all-to-all is issued at once (async, on NCCL's stream) and chunk i's FFT
runs while later chunks are still in flight, its return all-to-all while later chunks convolve.

Predicted effect on 2 H200s: on `large` (L = 32768, D = 2048) the reference spends ~0.6 ms in its
three inbound all-to-alls with their copies, ~0.2 ms in the return one, and ~0.8 ms in the FFT
convolution and elementwise work; this version exposes ~0.1 ms of communication and ~0.2 ms less
copying around the same FFT work: about 1.5x. On `pkb` both are launch-bound (tensors of 4 MB);
this one launches ~15 kernels and 2 collectives against ~35 and 4: about 1.5-2x. These were
predictions; the measured figures are in docs/gpu-results.md.

Conditions: any device (CPU/gloo included: everything is torch and torch.distributed, so the CPU
tests check it); bf16 inputs; the zigzag or contiguous split; any batch and group size.
"""

import torch
import torch.distributed as dist

CHUNK_BYTES = 16 << 20  # the size of z at which cutting the channels into chunks pays for itself
MAX_CHUNKS = 4


def _chunk_groups(groups_local: int, z_bytes: int) -> int:
    """Number of channel chunks: up to MAX_CHUNKS, at least CHUNK_BYTES of z each, dividing the groups."""
    want = max(1, min(MAX_CHUNKS, z_bytes // CHUNK_BYTES))
    while groups_local % want:
        want -= 1
    return want


def solution(
    x1_seq, x2_seq, v_seq, h, conv_bias, num_groups, group_dim, group=None, with_zigzag_splitting=True
):
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    batch, d, s = x1_seq.shape
    d_local, groups_local = d // w, num_groups // w
    seq, half = w * s, s // 2
    n = 2 * seq
    k = _chunk_groups(groups_local, x1_seq.numel() * x1_seq.element_size())
    gk = groups_local // k  # groups per chunk
    dk = gk * group_dim  # channels per chunk (of this rank's d_local)

    # 1. gate into rank-major send buffers, one per chunk, and start every chunk's all-to-all
    x2_r = x2_seq.view(batch, w, d_local, s).transpose(0, 1)  # [W, B, D/W, s], a view
    v_r = v_seq.view(batch, w, d_local, s).transpose(0, 1)
    inbound = []
    for i in range(k):
        part = slice(i * dk, (i + 1) * dk)
        send = torch.empty(w, batch, dk, s, dtype=x1_seq.dtype, device=x1_seq.device)
        torch.mul(x2_r[:, :, part], v_r[:, :, part], out=send)
        recv = torch.empty_like(send)
        inbound.append((send, recv, dist.all_to_all_single(recv, send, group=group, async_op=True)))

    # the filters' spectra, once per group, while the first chunk is in flight
    h_f = torch.fft.rfft(h[rank * groups_local : (rank + 1) * groups_local].float(), n=n)
    bias = conv_bias[rank * d_local : (rank + 1) * d_local].float()

    # 2. per chunk: unzigzag into a padded float32 buffer, convolve, bias, bf16, start the way back
    outbound = []
    for i, (_, recv, work) in enumerate(inbound):
        work.wait()
        z = torch.empty(batch, dk, n, dtype=torch.float32, device=x1_seq.device)
        z[..., seq:].zero_()
        if with_zigzag_splitting:
            # source rank j sent its chunks j and 2W-1-j: the first halves are chunks 0..W-1 in
            # order, the second halves chunks 2W-1..W
            got = recv.view(w, batch, dk, 2, half).permute(1, 2, 0, 3, 4)  # [B, dk, W, 2, s/2]
            natural = z[..., :seq].view(batch, dk, 2 * w, half)
            natural[:, :, :w].copy_(got[:, :, :, 0])
            natural[:, :, w:].copy_(got[:, :, :, 1].flip(2))
        else:
            z[..., :seq].view(batch, dk, w, s).copy_(recv.permute(1, 2, 0, 3))
        spectrum = torch.fft.rfft(z, n=n).view(batch, gk, group_dim, -1)
        spectrum.mul_(h_f[i * gk : (i + 1) * gk].unsqueeze(1))
        y = torch.fft.irfft(spectrum, n=n).view(batch, dk, n)[..., :seq]
        y.addcmul_(bias[i * dk : (i + 1) * dk].unsqueeze(-1), z[..., :seq])
        r = y.to(x1_seq.dtype)  # [B, dk, L], natural order
        back = torch.empty(w, batch, dk, s, dtype=r.dtype, device=r.device)
        if with_zigzag_splitting:
            chunks = r.view(batch, dk, 2 * w, half)
            to = back.view(w, batch, dk, 2, half)
            to[:, :, :, 0].copy_(chunks[:, :, :w].permute(2, 0, 1, 3))
            to[:, :, :, 1].copy_(chunks[:, :, w:].flip(2).permute(2, 0, 1, 3))
        else:
            back.copy_(r.view(batch, dk, w, s).permute(2, 0, 1, 3))
        home = torch.empty_like(back)  # [W (source: its channels), B, dk, s]
        outbound.append((back, home, dist.all_to_all_single(home, back, group=group, async_op=True)))

    # 3. the final gate, channels last: out[b, t, j*D/W + c] = x1[b, j*D/W + c, t] * r_j[b, c, t]
    out = torch.empty(batch, s, d, dtype=x1_seq.dtype, device=x1_seq.device)
    out_r = out.view(batch, s, w, d_local)
    x1_r = x1_seq.view(batch, w, d_local, s).permute(0, 3, 1, 2)  # [B, s, W, D/W], a view
    for i, (_, home, work) in enumerate(outbound):
        work.wait()
        part = slice(i * dk, (i + 1) * dk)
        torch.mul(x1_r[..., part], home.permute(1, 3, 0, 2), out=out_r[..., part])
    return out
