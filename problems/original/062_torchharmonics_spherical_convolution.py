"""The original benchmark's problem 62, exactly: torch-harmonics' distributed DISCO convolution on the sphere.

As the original's input builder makes them (a seed per rank): az = 2 ranks in azimuth when W is even,
else 1, and P = W / az in polar, rank r = q * az + a; the grid is nlat = 128 rounded up to a multiple
of P by nlon = 2 nlat rounded up to a multiple of az; rank r holds x N(0, 1) float32
[32, 8, nlat / P, nlon / az], weight N(0, 1) [8, 8, 3], bias N(0, 1) [8] and psi, a sparse COO
[3, nlat, (nlat / P) nlon] with, for each basis function k and output latitude o, 4 entries
0.05 N(0, 1) at row (o - q nlat / P) mod (nlat / P) and longitudes (o + e (k + 1)) mod nlon, e = 0..3
(every rank draws its own psi, weight and bias). It is called as
solution(x, psi, weight, 1, nlon, nlon, azimuth_group, polar_group, bias) and returns its block
[32, 8, nlat / P, nlon / az] of the convolution (pkb's problem 62 says what it computes), its own
weight and bias applied to it. Judged with the original harness's bounds, atol = rtol = 1e-2, no
norm bound; the inputs are drawn from secret seeds (pkb's, docs/variants.md). The groups are created
once per launch, on the first inputs (dist.new_group is collective). This file's reference
contracts with one sparse matmul where the original loops over the nlon output longitudes, and
reduce-scatters y where the original all-reduces it and keeps its slice. On a CPU device (the
tests' machine) the batch is 4 instead of 32: the original's loop takes about 12 s a call there.
"""

import math

import torch
import torch.distributed as dist

ID = 62
NAME = "torchharmonics_spherical_convolution"
CATEGORY = "spatial"
SOURCE = "torch-harmonics DistributedDiscreteContinuousConvS2 (torch fallback)"
SUMMARY = "DISCO convolution on a 128 x 256 sphere grid over polar x azimuth ranks (the original's)."
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
# cpu_batch: the batch on a CPU device (the tests' machine), where the original's loop of nlon
# sparse bmms over a batch of 32 takes about 12 s a call
SIZES = {"pkb": {"batch": 32, "channels": 8, "kernel": 3, "nlat": 128, "entries": 4, "cpu_batch": 4}}
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "rel_norm": math.inf}

_GROUPS: dict[int, tuple] = {}  # world size -> (azimuth group, polar group) of this rank


def _grid(world_size):
    az = 2 if world_size % 2 == 0 else 1
    return az, world_size // az


def _round_up(n, m):
    return -(-n // m) * m


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def _groups(world_size, rank):
    """This rank's (azimuth group, polar group) as the original's builder lays them out, created on
    the first call and cached."""
    if world_size not in _GROUPS:
        az, polar = _grid(world_size)
        az_group = polar_group = None
        for q in range(polar):
            g = dist.new_group(list(range(q * az, (q + 1) * az)))
            if rank // az == q:
                az_group = g
        for a in range(az):
            g = dist.new_group(list(range(a, world_size, az)))
            if rank % az == a:
                polar_group = g
        _GROUPS[world_size] = (az_group, polar_group)
    return _GROUPS[world_size]


def make_inputs(ctx):
    """The original's: see the docstring."""
    s, w = ctx.size, ctx.world_size
    az, polar = _grid(w)
    q = ctx.rank // az
    b = s["cpu_batch"] if ctx.device.type == "cpu" else s["batch"]
    c, k, e = s["channels"], s["kernel"], s["entries"]
    nlat = _round_up(s["nlat"], polar)
    nlon = _round_up(2 * nlat, az)
    lat, lon = nlat // polar, nlon // az
    x = ctx.randn(b, c, lat, lon, dtype=torch.float32)
    weight = ctx.randn(c, c, k, dtype=torch.float32)
    bias = ctx.randn(c, dtype=torch.float32)
    vals = ctx.randn(k * nlat * e, dtype=torch.float32, scale=0.05)
    size = (k, nlat, lat * nlon)
    if ctx.is_meta:  # shapes only, on the host: no process group exists there
        idx = torch.empty(3, k * nlat * e, dtype=torch.long, device="meta")
        psi = torch.sparse_coo_tensor(idx, vals, size, check_invariants=False)
        return x, psi, weight, 1, nlon, nlon, "azimuth group", "polar group", bias
    kk = torch.arange(k).view(k, 1, 1).expand(k, nlat, e)
    o = torch.arange(nlat).view(1, nlat, 1).expand(k, nlat, e)
    ee = torch.arange(e).view(1, 1, e)
    col = (o - q * lat) % lat * nlon + (o + ee * (kk + 1)) % nlon
    idx = torch.stack([kk.flatten(), o.flatten(), col.flatten()]).to(ctx.device)
    psi = torch.sparse_coo_tensor(idx, vals, size).coalesce()
    az_group, polar_group = _groups(w, ctx.rank)
    return x, psi, weight, 1, nlon, nlon, az_group, polar_group, bias


def _contract(x, psi, nlon_out):
    """y [nlat, K, nlon_out, B * C] from the full-longitude field x [B, C, lat, nlon_in]: psi's
    entries repeated for every output longitude, the input longitude shifted with it."""
    b, c, lat, nlon = x.shape
    k, nlat, _ = psi.shape
    psi = psi.coalesce()
    kk, o, col = psi.indices()
    p = torch.arange(nlon_out, device=x.device)
    rows = ((o * k + kk) * nlon_out).unsqueeze(1) + p
    cols = (col - col % nlon).unsqueeze(1) + (col % nlon).unsqueeze(1).add(p * (nlon // nlon_out)) % nlon
    vals = psi.values().unsqueeze(1).expand(-1, nlon_out)
    a = torch.sparse_coo_tensor(
        torch.stack([rows.flatten(), cols.flatten()]), vals.flatten(), (nlat * k * nlon_out, lat * nlon)
    )
    return torch.sparse.mm(a, x.reshape(b * c, lat * nlon).t()).view(nlat, k, nlon_out, b * c)


@torch.no_grad()
def solution(x, psi, weight, groups, nlon_out, nlon_in, azimuth_group=None, polar_group=None, bias=None):
    azimuth_group = azimuth_group or dist.group.WORLD
    polar_group = polar_group or dist.group.WORLD
    az = dist.get_world_size(azimuth_group)
    polar = dist.get_world_size(polar_group)
    b, c, lat, lon = x.shape
    cl = c // az
    if az > 1:
        send = x.view(b, az, cl, lat, lon).transpose(0, 1).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=azimuth_group)
        x = recv.permute(1, 2, 3, 0, 4).reshape(b, cl, lat, nlon_in)
    y = _contract(x, psi, nlon_out)
    if polar > 1:
        part = torch.empty((y.shape[0] // polar, *y.shape[1:]), dtype=y.dtype, device=y.device)
        dist.reduce_scatter_tensor(part, y, group=polar_group)
        y = part
    h, k = y.shape[0], y.shape[1]
    lon_out = nlon_out // az
    if az > 1:
        send = y.view(h, k, az, lon_out, b, cl).permute(2, 0, 1, 3, 4, 5).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=azimuth_group)
        y = recv.permute(1, 2, 3, 4, 0, 5).reshape(h, k, lon_out, b, c)
    else:
        y = y.view(h, k, lon_out, b, c)
    w = weight.view(groups, -1, weight.shape[1], k)
    out = torch.einsum("hkwbgc,gock->bgohw", y.view(h, k, lon_out, b, groups, -1), w)
    out = out.reshape(b, -1, h, lon_out)
    return out if bias is None else out + bias.view(1, -1, 1, 1)


def _reads(world_size, rank, nlat, nlon, kernel, entries):
    """Per azimuth column of the rank grid: (peers of `rank` in it, x points of each such peer that
    this rank's outputs read, this rank's output points that read them), from psi's pattern. Output
    (o, p) reads slab row o - q lat of every polar slab at longitudes (o + p + e (k + 1)) mod nlon."""
    az, polar = _grid(world_size)
    lat, lon = nlat // polar, nlon // az
    q, a = divmod(rank, az)
    shifts = torch.tensor(sorted({e * (k + 1) for k in range(kernel) for e in range(entries)}))
    o = torch.arange(q * lat, (q + 1) * lat).view(lat, 1, 1)
    p = torch.arange(a * lon, (a + 1) * lon).view(1, lon, 1)
    read = (o + p + shifts) % nlon  # [lat, lon, shifts]: the input longitude of each read
    rows = torch.zeros(lat, nlon, dtype=torch.bool)  # slab row x longitude: read by some output
    rows.scatter_(1, read.reshape(lat, -1), True)
    columns = []
    for col in range(az):
        peers = polar - 1 if col == a else polar
        points = int(rows[:, col * lon : (col + 1) * lon].sum())
        outputs = int((read // lon == col).any(-1).sum())
        columns.append((peers, points, outputs))
    return columns


def traffic(ctx):
    """Per GPU, the least over schedules (the original's own, all-to-all of x, polar reduce-scatter of
    y with C K / az values a point, all-to-all back, moves 2.65-3.5x more at W = 2-8): from each peer,
    the cheaper of (a) the peer's x points this rank's outputs read (C values each; every polar slab
    holds a row for every output latitude) and (b) the peer's partial sums for this rank's output
    points that read its x (C out = C in values each), in one round; the most over the ranks. It
    counts x and partial sums only. In the original every rank draws its own psi, weight and bias,
    so a rank that computes with a peer's x also needs the psi entries the peer's channels meet
    there (and a peer sending partial sums needs this rank's weight): bytes the bound leaves out, so
    it stays a lower bound, only looser. HBM: x read and out written once. FLOPs: every psi entry at
    every output longitude against B C values, then the channel contraction, spread over the ranks."""
    s, w = ctx.size, ctx.world_size
    az, polar = _grid(w)
    b, c, k, e = s["batch"], s["channels"], s["kernel"], s["entries"]
    nlat = _round_up(s["nlat"], polar)
    nlon = _round_up(2 * nlat, az)
    lat, lon = nlat // polar, nlon // az
    per_rank = [
        sum(peers * min(points, outputs) for peers, points, outputs in _reads(w, r, nlat, nlon, k, e))
        for r in range(w)
    ]
    return {
        "nvlink_bytes": float(max(per_rank) * c * b * 4),
        "hbm_bytes": 2 * b * c * lat * lon * 4,
        "flops": 2 * k * e * polar * b * c * lat * lon + 2 * b * c * c * k * lat * lon,
        "rounds": 1,
    }
