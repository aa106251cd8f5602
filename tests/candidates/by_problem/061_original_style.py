"""Problem 61 as gsplat's distributed packed projection does it, in its torch form: all-gather the
Gaussian counts and the cameras, build the 3D covariances, project into every camera (einsums),
cull, pack the visible pairs with torch.where, exchange the counts, then the radii, the float
attributes and the ids in three all-to-alls. As the original, it offsets each pair's Gaussian
id by the Gaussian count of the ranks before the rank it is sent to (OFFSET_BY = "receiver");
OFFSET_BY = "sender" offsets it by its own rank's. Called as the original harness calls it:
(means, quats, scales, opacities, colors, viewmats, Ks, width, height, 0.3, 0.01, 1e10, "pinhole")."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

OFFSET_BY = "receiver"


def _exchange(world: int, tensors: list[Tensor], sizes: list[int], incoming: list[int]) -> list[Tensor]:
    rows = len(tensors[0])
    packed = torch.cat([t.reshape(rows, -1) for t in tensors], dim=-1)
    widths = [t.numel() // rows if rows else int(torch.tensor(t.shape[1:]).prod()) for t in tensors]
    # one all_to_all_single with split sizes where the original passes lists of uneven tensors,
    # which gloo refuses (its list all-to-all wants equal sizes); the rows arrive in the same order
    joined = packed.new_empty((sum(incoming), packed.shape[1]))
    dist.all_to_all_single(joined, packed, output_split_sizes=incoming, input_split_sizes=sizes)
    return [p.reshape(-1, *t.shape[1:]) for p, t in zip(joined.split(widths, dim=-1), tensors, strict=True)]


def _rotmat(quats: Tensor) -> Tensor:
    w, x, y, z = torch.unbind(F.normalize(quats, p=2, dim=-1), dim=-1)
    entries = [
        1 - 2 * (y**2 + z**2), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x**2 + z**2), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x**2 + y**2),
    ]  # fmt: skip
    return torch.stack(entries, dim=-1).reshape((*quats.shape[:-1], 3, 3))


def _project(means, covars, viewmats, Ks, width, height, eps2d, near_plane, far_plane):
    rot, trans = viewmats[..., :3, :3], viewmats[..., :3, 3]
    means_c = torch.einsum("...cij,...nj->...cni", rot, means) + trans[..., None, :]
    covars_c = torch.einsum("...cij,...njk,...clk->...cnil", rot, covars, rot)
    tx, ty, tz = torch.unbind(means_c, dim=-1)
    tz2 = tz**2
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    fov_x, fov_y = 0.5 * width / fx, 0.5 * height / fy
    tx = tz * torch.clamp(tx / tz, min=-(cx / fx + 0.3 * fov_x), max=(width - cx) / fx + 0.3 * fov_x)
    ty = tz * torch.clamp(ty / tz, min=-(cy / fy + 0.3 * fov_y), max=(height - cy) / fy + 0.3 * fov_y)
    zero = torch.zeros_like(tz)
    jac = torch.stack([fx / tz, zero, -fx * tx / tz2, zero, fy / tz, -fy * ty / tz2], dim=-1)
    jac = jac.reshape((*tz.shape, 2, 3))
    cov2d = torch.einsum("...ij,...jk,...kl->...il", jac, covars_c, jac.transpose(-1, -2))
    means2d = torch.einsum("...ij,...nj->...ni", Ks[..., :2, :3], means_c) / tz[..., None]
    cov2d = cov2d + torch.eye(2, device=means.device, dtype=means.dtype) * eps2d
    det = (cov2d[..., 0, 0] * cov2d[..., 1, 1] - cov2d[..., 0, 1] * cov2d[..., 1, 0]).clamp(min=1e-10)
    conics = torch.stack(
        [cov2d[..., 1, 1] / det, -(cov2d[..., 0, 1] + cov2d[..., 1, 0]) / 2.0 / det, cov2d[..., 0, 0] / det],
        dim=-1,
    )
    depths = means_c[..., 2]
    radius = torch.stack(
        [torch.ceil(3.33 * torch.sqrt(cov2d[..., 0, 0])), torch.ceil(3.33 * torch.sqrt(cov2d[..., 1, 1]))],
        dim=-1,
    )
    radius[~((depths > near_plane) & (depths < far_plane))] = 0.0
    x, y = means2d[..., 0], means2d[..., 1]
    inside = (x + radius[..., 0] > 0) & (x - radius[..., 0] < width)
    inside &= (y + radius[..., 1] > 0) & (y - radius[..., 1] < height)
    radius[~inside] = 0.0
    return radius.int(), means2d, depths, conics


def solution(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    image_width: int,
    image_height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    camera_model: str = "pinhole",
) -> tuple[Tensor, ...]:
    world = dist.get_world_size()
    n, c = means.shape[0], viewmats.shape[0]
    counts = torch.empty(world, dtype=torch.int, device=means.device)
    # a [1] tensor where the original gathers a 0-dim one, which gloo refuses (NCCL takes both)
    dist.all_gather_into_tensor(counts, torch.tensor([n], dtype=torch.int, device=means.device))
    n_world = counts.tolist()
    cams = torch.cat([viewmats.reshape(c, -1), Ks.reshape(c, -1)], dim=-1)
    every = [torch.empty_like(cams) for _ in range(world)]
    dist.all_gather(every, cams)
    every_cams = torch.cat(every, dim=0)
    all_views, all_ks = every_cams[:, :16].reshape(-1, 4, 4), every_cams[:, 16:].reshape(-1, 3, 3)

    rot = _rotmat(quats)
    m = rot * scales[..., None, :]
    covars = torch.einsum("...ij,...kj -> ...ik", m, m)
    radii, means2d, depths, conics = _project(
        means, covars, all_views, all_ks, image_width, image_height, eps2d, near_plane, far_plane
    )
    keep = (radii > 0).all(dim=-1)
    camera_ids, gaussian_ids = torch.where(keep)
    camera_ids, gaussian_ids = camera_ids.int(), gaussian_ids.int()
    radii, means2d, depths, conics = radii[keep], means2d[keep], depths[keep], conics[keep]
    opacities, colors = opacities[gaussian_ids.long()], colors[gaussian_ids.long()]

    per_rank = torch.bincount(camera_ids.long(), minlength=c * world).split([c] * world)
    sizes = [int(p.sum()) for p in per_rank]
    out_sizes = torch.empty(world, dtype=torch.int64, device=means.device)
    dist.all_to_all_single(out_sizes, torch.tensor(sizes, dtype=torch.int64, device=means.device))
    incoming = out_sizes.tolist()

    (radii,) = _exchange(world, [radii], sizes, incoming)
    means2d, depths, conics, opacities, colors = _exchange(
        world, [means2d, depths, conics, opacities, colors], sizes, incoming
    )
    repeats = torch.tensor(sizes, device=means.device)
    # offsets as cumulative sums, which (as in the original) makes both id tensors int64
    first_camera = torch.cumsum(
        torch.tensor([0] + [c] * (world - 1), device=means.device, dtype=torch.int), 0
    )
    camera_ids = camera_ids - first_camera.repeat_interleave(repeats)
    starts = torch.cumsum(torch.tensor([0, *n_world[:-1]], device=means.device, dtype=torch.int), dim=0)
    if OFFSET_BY == "receiver":
        gaussian_ids = gaussian_ids + starts.repeat_interleave(repeats)
    else:
        gaussian_ids = gaussian_ids + starts[dist.get_rank()].expand(gaussian_ids.shape)
    camera_ids, gaussian_ids = _exchange(world, [camera_ids, gaussian_ids], sizes, incoming)
    return camera_ids, gaussian_ids, radii, means2d, depths, conics, opacities, colors
