"""Problem 62 in the original's convention, the way torch-harmonics' torch fallback writes it: a
list all-to-all from longitudes to channels, a loop over the output longitudes (the field rolled by
one step each time, a batched sparse matmul with psi per step), an all-reduce of y over the polar
group and this rank's latitude slice of it, a list all-to-all back, and the channel contraction."""

import torch
import torch.distributed as dist


def _even_split(n, parts):
    return [n // parts] * parts


def _swap(t, split_dim, cat_dim, group):
    """Split t along split_dim into one piece per rank of the group, exchange the pieces, and join
    what arrives along cat_dim."""
    pieces = [
        p.contiguous()
        for p in torch.split(t, _even_split(t.shape[split_dim], dist.get_world_size(group)), split_dim)
    ]
    arrived = [torch.empty_like(p) for p in pieces]
    dist.all_to_all(arrived, pieces, group=group)
    return torch.cat(arrived, dim=cat_dim)


@torch.no_grad()
def solution(x, psi, weight, groups, nlon_out, nlon_in, azimuth_group=None, polar_group=None, bias=None):
    azimuth_group = azimuth_group or dist.group.WORLD
    polar_group = polar_group or dist.group.WORLD
    n_az = dist.get_world_size(azimuth_group)
    n_polar = dist.get_world_size(polar_group)
    if n_az > 1:
        x = _swap(x, 1, 3, azimuth_group)
    b, c, lat, nlon = x.shape
    k, nlat, _ = psi.shape
    step = nlon // nlon_out
    field = x.reshape(b * c, lat * nlon).t().unsqueeze(0).expand(k, -1, -1)
    y = torch.zeros(nlon_out, k, nlat, b * c, dtype=x.dtype, device=x.device)
    rolled = x
    for p in range(nlon_out):
        field = rolled.reshape(b * c, lat * nlon).t().unsqueeze(0).expand(k, -1, -1).contiguous()
        y[p] = torch.bmm(psi, field)
        rolled = torch.roll(rolled, -step, dims=3)
    y = y.permute(3, 1, 2, 0).reshape(b, c, k, nlat, nlon_out)
    if n_polar > 1:
        dist.all_reduce(y, group=polar_group)
        y = torch.split(y, _even_split(nlat, n_polar), dim=3)[dist.get_rank(polar_group)]
    if n_az > 1:
        y = _swap(y, 4, 1, azimuth_group)
    bb, cc, kk, h, w = y.shape
    y = y.reshape(bb, groups, cc // groups, kk, h, w)
    out = torch.einsum("bgckhw,gock->bgohw", y, weight.reshape(groups, -1, weight.shape[1], kk))
    out = out.reshape(bb, -1, h, w)
    return out if bias is None else out + bias.view(1, -1, 1, 1)
