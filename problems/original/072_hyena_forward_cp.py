"""The original benchmark's problem 72, exactly: Hyena's FFT long convolution under context parallelism.

As the original's input builder makes them (a seed per rank): rank r holds its zigzag positions of
x1_seq, x2_seq and v_seq [1, 1024, 2048] bf16, standard normal (chunks r and 2W-1-r of the 2W chunks
of 1024 positions), and the same constants on every rank: the filters h [1024, 4096] bf16, h[g, s] =
bf16(g 4096 + s) / 4096 (an arange in bf16: piecewise constant along s, about g + s / 4096, and never
decaying), and conv_bias [1024] bf16 = c / 1024. Called as solution(x1_seq, x2_seq, v_seq, h,
conv_bias, 1024, 1, None, True). Three all-to-alls bring x1, x2 and v to a channel split over the
whole sequence (L = 2048 W, natural order); with z = bf16(x2 v), y = the causal convolution of z with
h over the whole sequence by a float32 FFT of size 2L plus conv_bias z, rounded to bf16; a fourth
all-to-all returns bf16(x1 y) to the zigzag sequence split: every rank returns [1, 2048, 1024]
(positions, channels). Judged as the original harness judges: atol = rtol = 1e-2, no norm bound; the
inputs are drawn from secret seeds (pkb's, docs/variants.md).

The original's filters make y about c times the running sum of z (|out| up to about 6e5), so the
FFT's float32 rounding is of the order of the tolerance where y is small: the reference computes y
as the original does (pkb's own FFT scaling matches it bit for bit on CPU), and a float64
convolution differs from it by more than the tolerance on 3 of 262144 outputs (64 channels at W = 2,
one seed, CPU): a more precise solution can fail here.
"""

import math

import torch
import torch.distributed as dist

ID = 72
NAME = "hyena_forward_cp"
CATEGORY = "CP"
SOURCE = "Savanna / Evo 2 Hyena operator (context parallelism)"
SUMMARY = "Hyena FFT long conv of bf16 [1, 1024, 2048] zigzag shards, arange filters (the original's)."
DTYPE = "float32"
WORLD_SIZES = "world size >= 2 dividing num_groups (1024)"
SIZES = {"pkb": {"batch": 1, "num_groups": 1024, "group_dim": 1, "seq_local": 2048, "filter_len": 4096}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["num_groups"] % world_size:
        return f"num_groups = {size['num_groups']} is not divisible by the world size {world_size}"
    return None


def make_inputs(ctx):
    """The original's: x1, x2, v standard normal per rank; h and conv_bias its arange fills."""
    s = ctx.size
    d = s["num_groups"] * s["group_dim"]
    shape = (s["batch"], d, s["seq_local"])
    x1, x2, v = (ctx.randn(*shape, dtype=torch.bfloat16) for _ in range(3))
    bf16 = torch.bfloat16
    taps = s["filter_len"]
    h = torch.arange(s["num_groups"] * taps, dtype=bf16, device=ctx.device).view(s["num_groups"], taps) / taps
    conv_bias = torch.arange(d, dtype=bf16, device=ctx.device) / d
    return x1, x2, v, h, conv_bias, s["num_groups"], s["group_dim"], None, True


def _zigzag_chunks(w, device):
    """Natural chunk index of each chunk in rank-major order: rank r's chunks are r and 2W-1-r."""
    ranks = torch.arange(w, device=device)
    return torch.stack([ranks, 2 * w - 1 - ranks], dim=1).reshape(-1)


def _seq_to_channels(x, w, group, zigzag):
    """[B, D, seq_local] (sequence split) -> [B, D/W, L] (channel split, natural order)."""
    batch, d, seq_local = x.shape
    send = x.view(batch, w, d // w, seq_local).transpose(0, 1).contiguous()  # [W, B, D/W, s]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    if not zigzag:
        return recv.permute(1, 2, 0, 3).reshape(batch, d // w, w * seq_local)
    chunks = recv.view(w, batch, d // w, 2, seq_local // 2).permute(1, 2, 0, 3, 4)
    chunks = chunks.reshape(batch, d // w, 2 * w, seq_local // 2)
    natural = torch.argsort(_zigzag_chunks(w, x.device))
    return chunks.index_select(2, natural).view(batch, d // w, w * seq_local)


def _channels_to_seq(y, w, group, zigzag):
    """[B, D/W, L] (channel split, natural order) -> [B, seq_local, D] (sequence split, channels last)."""
    batch, d_local, seq = y.shape
    seq_local = seq // w
    if zigzag:
        chunks = y.view(batch, d_local, 2 * w, seq_local // 2).index_select(2, _zigzag_chunks(w, y.device))
        send = chunks.view(batch, d_local, w, seq_local).transpose(0, 2).contiguous()  # [W, D/W, B, s]
    else:
        send = y.view(batch, d_local, w, seq_local).transpose(0, 2).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(2, 3, 0, 1).reshape(batch, seq_local, w * d_local)


@torch.no_grad()
def solution(
    x1_seq, x2_seq, v_seq, h, conv_bias, num_groups, group_dim, group=None, with_zigzag_splitting=True
):
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    x1, x2, v = (_seq_to_channels(t, w, group, with_zigzag_splitting) for t in (x1_seq, x2_seq, v_seq))
    _, d_local, seq = x1.shape
    groups_local = num_groups // w
    h_local = h[rank * groups_local : (rank + 1) * groups_local].float().repeat_interleave(group_dim, dim=0)
    bias_local = conv_bias[rank * d_local : (rank + 1) * d_local].float().unsqueeze(-1)

    z = (x2 * v).float()
    n = 2 * seq  # zero padding to 2L turns the FFT's circular convolution into a causal one
    # the original's scaling, step for step: its rounding is of the order of the tolerance
    h_f = torch.fft.rfft(h_local, n=n) / n
    y = torch.fft.irfft(torch.fft.rfft(z, n=n) * h_f.unsqueeze(0), n=n, norm="forward")[..., :seq]
    y = (y + z * bias_local).to(x1.dtype)
    return _channels_to_seq(x1 * y, w, group, with_zigzag_splitting)


def traffic(ctx):
    """Per GPU, the least: gating first leaves two all-to-alls, z to the channel split and bf16(y)
    back, 2 (W-1)/W of a [B, D, seq_local] bf16 tensor (the original sends four), in two dependent
    steps. FLOPs: per local channel a real FFT of size 2L and its inverse, the filter's FFT, the
    products. HBM: x1, x2, v, this rank's filter rows and the bias read, the output written."""
    w, s = ctx.world_size, ctx.size
    batch, seq_local, taps = s["batch"], s["seq_local"], s["filter_len"]
    d = s["num_groups"] * s["group_dim"]
    elems = batch * d * seq_local
    n = 2 * w * seq_local
    fft = 2.5 * n * math.log2(n)
    d_local = batch * d // w
    return {
        "nvlink_bytes": 2 * (w - 1) / w * elems * 2,
        "hbm_bytes": (4 * elems + s["num_groups"] // w * taps + d) * 2,
        "flops": d_local * (2 * fft + 3 * n) + s["num_groups"] // w * fft + 5 * elems,
        "rounds": 2,
    }
