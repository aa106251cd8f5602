"""Hyena long convolution under context parallelism: sequence-to-channel all-to-alls around an FFT conv.

Evo 2's Hyena operator, trained by Savanna with context parallelism. The sequence (length L = W *
seq_local) is split across ranks in zigzag order: cut into 2W chunks of seq_local/2 positions,
rank r holds chunks r and 2W-1-r, in that order (with with_zigzag_splitting False, the contiguous
positions r*seq_local ..). Each rank holds its positions of three projections, x1_seq, x2_seq and
v_seq, [batch, D, seq_local] in bf16 (channels first), and, the same on every rank, the long filters
h [num_groups, filter_len] in bf16 (channel c uses row c // group_dim, D = num_groups * group_dim)
and the bias conv_bias [D] in bf16. With z = x2 * v (rounded to bf16), every rank must return, for
its positions t and every channel c,

  y[c, t]  = sum over s = 0 .. min(t, filter_len - 1) of h[c // group_dim, s] * z[c, t - s]
             + conv_bias[c] * z[c, t]              (causal convolution over the whole sequence, float32)
  out[t, c] = x1[c, t] * bf16(y[c, t])             [batch, seq_local, D] in bf16, positions in the
                                                   rank's (zigzag) order, channels last.

The reference does what Savanna does: three all-to-alls bring x1, x2 and v from the sequence split
to a channel split (each rank then holds D/W channels over the whole sequence, in natural order),
it gates, convolves with a zero-padded float32 FFT of size 2L (the filter transformed per group,
not per channel), adds the bias term, gates with x1, and a fourth all-to-all takes the result back
to the sequence split, channels last. The call passes (x1_seq, x2_seq, v_seq, h, conv_bias,
num_groups, group_dim, None, True) as the original harness does.

Source: Savanna / Evo 2 Hyena operator with context parallelism (ParallelKernelBench problem 72, one
of the workloads the benchmark's authors single out: a model-written kernel beat its reference by
up to 1.72x). The pkb shapes are the original's (x1, x2, v [1, 1024, 2048] per rank, h [1024, 4096]:
1024 single-channel groups, a filter of 4096 taps).

Differences from the original: none in the workload or the call. The output is returned contiguous
(the original returns a transposed view of [batch, D, seq_local]; the values and shape are the
same). The inputs are random and differ per rank and per trial; the filters decay with a random
length per group (from 16 taps to filter_len), so the convolution reaches across ranks. DTYPE is
float32 because all the arithmetic (FFT, products) is float32, the roofline's compute peak; inputs
and output are bf16 as in the original.
"""

import math

import torch
import torch.distributed as dist

ID = 72
NAME = "hyena_forward_cp"
CATEGORY = "CP"
SOURCE = "Savanna / Evo 2 Hyena operator (context parallelism)"
SUMMARY = (
    "Hyena FFT long conv on a zigzag sequence split: seq-to-channel all-to-alls, gating, bf16 [B, S/W, D]."
)
DTYPE = "float32"
WORLD_SIZES = "world size >= 2 dividing num_groups (pkb: 1024 % W == 0), filter_len <= W * seq_local"
SIZES = {
    # batch; num_groups x group_dim = D channels; seq_local: this rank's positions; filter_len: taps
    "pkb": {"batch": 1, "num_groups": 1024, "group_dim": 1, "seq_local": 2048, "filter_len": 4096},
    # estimate, not yet measured: at W = 2 (L = 32768) four all-to-alls of 34 MB each way
    # (~0.4 ms) and a float32 FFT conv over 1024 channels x 65536 points (~1 ms), ~2 ms in all
    "large": {"batch": 1, "num_groups": 256, "group_dim": 8, "seq_local": 16384, "filter_len": 32768},
}
# out = x1 * bf16(y) is O(1), up to ~30. Correct solutions differ in rounding: the reference rounds
# z = x2 * v and y to bf16 and the product once more, a fused solution may keep z and y in float32;
# FFT and direct convolutions in float32 differ by ~1e-6 of the norm. Measured on CPU at W = 2 and 4
# against a float64 computation from the unrounded product: relative norm 3.3e-3, at most one bf16
# unit in the last place (0.125 where |out| > 16). A Savanna-style float32 pipeline matches bit for bit.
TOLERANCE = {"atol": 0.03, "rtol": 0.03, "rel_norm": 0.01}
SHORTEST_DECAY = 16.0  # taps: the fastest-decaying filter's e-folding length


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if size["num_groups"] % world_size:
        return f"num_groups = {size['num_groups']} is not divisible by the world size {world_size}"
    if size["seq_local"] % 2:
        return f"seq_local = {size['seq_local']} must be even (two zigzag chunks per rank)"
    if size["filter_len"] > world_size * size["seq_local"]:
        return f"filter_len = {size['filter_len']} exceeds the sequence, {world_size} x {size['seq_local']}"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): a batch of 2, groups
    in multiples of 8 W (split over the ranks) of 1 to 4 channels, at most 768 channels, zigzag chunks
    in multiples of 32 positions (seq_local of 64), filters in multiples of 64 taps up to the sequence."""
    group_dim = draw("group_dim", 1, 4)
    seq_local = draw("seq_local", 512, 2048, 64)
    step = 8 * world_size
    return {
        "batch": draw("batch", 1, 2),
        "num_groups": draw("num_groups", step, max(step, 768 // group_dim), step),
        "group_dim": group_dim,
        "seq_local": seq_local,
        "filter_len": draw("filter_len", 256, world_size * seq_local, 64),
    }


def make_inputs(ctx):
    """x1, x2, v N(0, 1) per rank; shared filters with unit energy decaying exp(-s / tau), tau
    log-uniform in [16, filter_len] per group; shared bias N(0, 0.25)."""
    s = ctx.size
    d = s["num_groups"] * s["group_dim"]
    shape = (s["batch"], d, s["seq_local"])
    x1, x2, v = (ctx.randn(*shape, dtype=torch.bfloat16) for _ in range(3))
    taps = s["filter_len"]
    log_tau = ctx.rand(
        s["num_groups"],
        1,
        low=math.log(SHORTEST_DECAY),
        high=math.log(taps),
        dtype=torch.float32,
        shared=True,
    )
    decay = torch.exp(-torch.arange(taps, device=ctx.device, dtype=torch.float32) / log_tau.exp())
    h = ctx.randn(s["num_groups"], taps, dtype=torch.float32, shared=True) * decay
    h = h / h.norm(dim=1, keepdim=True)
    conv_bias = ctx.randn(d, dtype=torch.bfloat16, shared=True, scale=0.5)
    return x1, x2, v, h.to(torch.bfloat16), conv_bias, s["num_groups"], s["group_dim"], None, True


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
    # rank-major chunks [B, D/W, 2W, s/2] -> natural order
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
    recv = torch.empty_like(send)  # [W (source: its channels), D/W, B, s]
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(2, 3, 0, 1).reshape(batch, seq_local, w * d_local)


def solution(
    x1_seq, x2_seq, v_seq, h, conv_bias, num_groups, group_dim, group=None, with_zigzag_splitting=True
):
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    x1, x2, v = (_seq_to_channels(t, w, group, with_zigzag_splitting) for t in (x1_seq, x2_seq, v_seq))
    batch, d_local, seq = x1.shape
    groups_local = num_groups // w
    h_local = h[rank * groups_local : (rank + 1) * groups_local].float()
    bias_local = conv_bias[rank * d_local : (rank + 1) * d_local].float().unsqueeze(-1)

    z = (x2 * v).float()  # the gate, rounded to bf16 as Savanna computes it
    n = 2 * seq  # zero padding to 2L turns the FFT's circular convolution into a causal one
    h_f = torch.fft.rfft(h_local, n=n).unsqueeze(1)  # [G/W, 1, n/2+1]: once per group
    z_f = torch.fft.rfft(z, n=n).view(batch, groups_local, group_dim, -1)
    y = torch.fft.irfft(z_f * h_f, n=n)[..., :seq].reshape(batch, d_local, seq)
    y = y.addcmul_(bias_local, z).to(x1.dtype)
    return _channels_to_seq(x1 * y, w, group, with_zigzag_splitting)


def traffic(ctx):
    """Per GPU, each component the least any schedule needs (so the floor bounds every schedule).

    NVLink: the reference moves four tensors from the sequence split to the channel split or back,
    4 (W-1)/W of a [B, D, seq_local] bf16 tensor. Gating first (z = x2 * v is elementwise, and so is
    the final product with x1, which can stay where it is) leaves two: z to the channel split and
    bf16(y) back, 2 (W-1)/W. A sequence-parallel convolution instead needs, for both chunks of a
    rank, up to filter_len - 1 earlier positions of all D channels: no less for filters as long as
    these (at W = 2, as much). Two dependent steps.
    FLOPs: per local channel a real FFT of size n = 2L and its inverse (2.5 n log2 n each), the
    complex product, the filters' FFTs (per group), the gating and bias terms. HBM: read x1, x2, v,
    this rank's filter rows and the bias, write the output; an FFT convolution of one channel
    (2L float32 points) fits on chip.
    """
    w = ctx.world_size
    s = ctx.size
    batch, seq_local, taps = s["batch"], s["seq_local"], s["filter_len"]
    d = s["num_groups"] * s["group_dim"]
    elems = batch * d * seq_local  # one [B, D, seq_local] tensor
    n = 2 * w * seq_local
    fft = 2.5 * n * math.log2(n)
    d_local = batch * d // w
    return {
        "nvlink_bytes": 2 * (w - 1) / w * elems * 2,
        "hbm_bytes": (4 * elems + s["num_groups"] // w * taps + d) * 2,
        "flops": d_local * (2 * fft + 3 * n) + s["num_groups"] // w * fft + 5 * elems,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(x1_seq, x2_seq, v_seq, h, conv_bias, num_groups, group_dim, group=None, "
        "with_zigzag_splitting=True)"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "none in the workload or the call. The output is returned contiguous (the original returns a "
        "transposed view of [batch, D, seq_local]; the values and shape are the same). The inputs are "
        "random and differ per rank and per trial; the filters decay with a random length per group (from"
        " 16 taps to filter_len), so the convolution reaches across ranks. DTYPE is float32 because all "
        "the arithmetic (FFT, products) is float32, the roofline's compute peak; inputs and output are "
        "bf16 as in the original."
    ),
}
