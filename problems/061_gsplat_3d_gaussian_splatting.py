"""Distributed 3D Gaussian splatting projection: every rank's Gaussians projected into every rank's
cameras, culled, and the visible (camera, Gaussian) pairs sent to the camera's owner.

Layout: rank r holds N Gaussians (means [N, 3], quaternions [N, 4], scales [N, 3], opacities [N],
colors [N, 3], float32) and C cameras (world-to-camera viewmats [C, 4, 4], intrinsics Ks [C, 3, 3]).
Each rank gathers every rank's cameras and Gaussian counts, builds its Gaussians' 3D covariances
(R S S^T R^T from the normalized quaternion and the scales), projects them into all W * C cameras
(pinhole; the 2D covariance J W Sigma W^T J^T with the Jacobian's x/z and y/z clamped to 1.3 times
the field of view, plus eps2d on the diagonal), and keeps a pair when its depth lies in
(near_plane, far_plane) and its box of radius ceil(3.33 sigma) per axis touches the image. The
visible pairs of camera c go to c's owner, which returns them as 8 tensors of one length R:

  camera_ids  int64 [R]     the camera, numbered on its owner (0 .. C - 1)
  gaussian_ids int64 [R]    the Gaussian, numbered globally (rank s's start after ranks < s)
  radii       int32 [R, 2]  ceil(3.33 sigma_x), ceil(3.33 sigma_y) in pixels
  means2d     float32 [R, 2], depths float32 [R], conics float32 [R, 3] (the inverse 2D covariance:
              xx, xy, yy), opacities float32 [R], colors float32 [R, 3]

The reference returns them by source rank, then camera, then Gaussian; `canonical` sorts every
output by (camera, Gaussian), so a solution may return the pairs in any order. The call is the
original's: solution(means, quats, scales, opacities, colors, viewmats, Ks, width, height, 0.3,
0.01, 1e10, "pinhole").

Inputs: cameras around the scene (angles within 0.15 rad, 3 units away, focal 0.8 x the image
side within 10%), drawn for all ranks from a shared seed; Gaussians per rank: 3/4 in a central
cube (|coordinate| <= 0.35) that every camera sees whole, 1/4 in a wider slab (|x|, |y| <= 2.4,
|z| <= 0.6) that each camera sees in part, so that culling decides. No tie at a cutoff: every
Gaussian is checked in float64 against every camera and redrawn while 3.33 sigma lies within 2e-3
of an integer or a box edge within 0.01 pixel of the image's border, so float32 and float64
solutions keep the same pairs and radii.

Source: gsplat's distributed rasterization (gsplat.rendering, packed projection followed by the
all-to-all of projected Gaussians to their cameras' ranks), as ParallelKernelBench problem 61 has
it (its torch implementation of the fully fused projection).

Differences from the original:
- float32 throughout, as gsplat computes; the original runs the projection in bfloat16 (its builder
  ignores the requested dtype), where means2d has 2-pixel steps and radii flip with the rounding.
- Cameras: random per rank and trial (the original gives every rank the identity camera and the
  same intrinsics, so a rank could skip the camera all-gather), C per rank (1 at pkb, as the
  original). Gaussians: a wider slab, so that some are culled (the original's are all visible),
  and redrawn away from the cutoffs.
- gaussian_ids are global ids: the Gaussian's index on its rank plus the Gaussians of the ranks
  before its own. The original adds the offset of the rank it sends the pair to, so ids from
  different ranks collide on the receiver (at W = 2 rank 1 gets ids 1024-2047 twice).
- Judged in canonical order (sorted by camera, then Gaussian), not in the reference's.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

ID = 61
NAME = "gsplat_3d_gaussian_splatting"
CATEGORY = "non-LLM"
SOURCE = "gsplat (distributed packed projection)"
SUMMARY = (
    "Project every rank's 3D Gaussians into every rank's cameras, cull, all-to-all to the camera's owner."
)
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
SIZES = {
    "pkb": {"gaussians": 1024, "cameras": 1, "width": 512, "height": 512},
    # estimate, not yet measured: at W = 4 each rank sends each peer >= 3.1 M visible Gaussians'
    # 52 bytes (0.49 GB, 1.2 ms at 395 GB/s) against about 1.6 GB of HBM traffic (0.4 ms)
    "large": {"gaussians": 4194304, "cameras": 2, "width": 1024, "height": 1024},
}
# Measured (CPU, pkb size, 1 trial at W = 2 and 4, every rank): the original's algorithm run in
# float64 (the original-style candidate with its inputs cast up, its floats cast back) against this
# reference: the same pairs and radii, worst |error| 6.1e-5 (one float32 step of a 2D mean near
# 512 px; relative 1.2e-7), relative error norm 2.4e-7; in float32 (061_original_style.py with the
# ids offset by the sender) 5.0e-6 and 1.6e-7. Bounds: rtol 80x, rel_norm 8x that.
TOLERANCE = {"atol": 1e-4, "rtol": 1e-5, "rel_norm": 2e-6}

EPS2D, NEAR, FAR = 0.3, 0.01, 1e10
CORE = 0.75  # share of a rank's Gaussians in the central cube every camera sees
RADIUS_MARGIN = 2e-3  # least distance of 3.33 sigma from an integer (float64 check)
EDGE_MARGIN = 0.01  # least distance, in pixels, of a box edge from the image border


_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    return None if world_size >= 2 else "needs at least 2 ranks"


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): several cameras per
    rank, any count of Gaussians (within 1.5x pkb's projections) and image sides of 32s."""
    cameras = draw("cameras", 1, 4)
    return {
        "gaussians": draw("gaussians", 128, 1536 // cameras),
        "cameras": cameras,
        "width": draw("width", 256, 768, 32),
        "height": draw("height", 256, 768, 32),
    }


def _rotations(q):
    """Rotation matrices [..., 3, 3] of quaternions (w, x, y, z), normalized first."""
    w, x, y, z = F.normalize(q, dim=-1).unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )  # fmt: skip
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def _project(means, quats, scales, views, ks, width, height, eps2d):
    """Every Gaussian in every camera ([V, N, ...]): 3.33 sigma per axis (before the ceiling), the 2D
    mean, the depth and the conic."""
    m = _rotations(quats) * scales.unsqueeze(-2)
    cov = m @ m.transpose(-1, -2)  # [N, 3, 3]
    rot, shift = views[:, :3, :3], views[:, :3, 3]
    cam = torch.einsum("vij,nj->vni", rot, means) + shift[:, None]  # [V, N, 3]
    cov_cam = rot[:, None] @ cov[None] @ rot.transpose(-1, -2)[:, None]  # [V, N, 3, 3]
    tx, ty, tz = cam.unbind(-1)
    fx, fy = ks[:, 0, 0, None], ks[:, 1, 1, None]
    cx, cy = ks[:, 0, 2, None], ks[:, 1, 2, None]
    # the Jacobian uses x/z and y/z clamped to 1.3 times the field of view
    half_x, half_y = 0.5 * width / fx, 0.5 * height / fy
    cxz = tx / tz
    cyz = ty / tz
    cxz = torch.minimum(torch.maximum(cxz, -(cx / fx + 0.3 * half_x)), (width - cx) / fx + 0.3 * half_x)
    cyz = torch.minimum(torch.maximum(cyz, -(cy / fy + 0.3 * half_y)), (height - cy) / fy + 0.3 * half_y)
    zero = torch.zeros_like(tz)
    jac = torch.stack([fx / tz, zero, -fx * cxz / tz, zero, fy / tz, -fy * cyz / tz], -1).unflatten(
        -1, (2, 3)
    )
    cov2d = jac @ cov_cam @ jac.transpose(-1, -2)
    a = cov2d[..., 0, 0] + eps2d
    d = cov2d[..., 1, 1] + eps2d
    b = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    det = (a * d - cov2d[..., 0, 1] * cov2d[..., 1, 0]).clamp(min=1e-10)
    conics = torch.stack([d / det, -b / det, a / det], dim=-1)
    means2d = torch.einsum("vij,vnj->vni", ks[:, :2, :3], cam) / tz[..., None]
    extent = 3.33 * torch.stack([a.sqrt(), d.sqrt()], dim=-1)
    return extent, means2d, tz, conics


def _keep(extent, means2d, depths, width, height, near, far):
    """radii [V, N, 2] int32 (0 where culled) and the visible mask [V, N]."""
    radius = torch.ceil(extent)
    radius = torch.where(((depths > near) & (depths < far))[..., None], radius, 0.0)
    x, y = means2d.unbind(-1)
    rx, ry = radius.unbind(-1)
    inside = (x + rx > 0) & (x - rx < width) & (y + ry > 0) & (y - ry < height)
    radii = torch.where(inside[..., None], radius, 0.0).int()
    return radii, (radii > 0).all(dim=-1)


def _cameras(ctx, count):
    """`count` cameras (viewmats [count, 4, 4], Ks [count, 3, 3], float32), from shared draws."""
    s = ctx.size
    if ctx.is_meta:
        return (torch.empty(count, 4, 4, device="meta"), torch.empty(count, 3, 3, device="meta"))
    ax, ay, az = ctx.rand(count, 3, low=-0.15, high=0.15, shared=True).double().unbind(-1)
    one, nil = torch.ones_like(ax), torch.zeros_like(ax)

    def turn(a, i, j):  # rotation by a in the (i, j) plane
        m = torch.stack([one, nil, nil, nil, one, nil, nil, nil, one], -1).unflatten(-1, (3, 3)).clone()
        m[:, i, i], m[:, i, j], m[:, j, i], m[:, j, j] = a.cos(), -a.sin(), a.sin(), a.cos()
        return m

    views = torch.zeros(count, 4, 4, dtype=torch.float64, device=ctx.device)
    views[:, :3, :3] = turn(az, 0, 1) @ turn(ay, 2, 0) @ turn(ax, 1, 2)
    views[:, :3, 3] = ctx.rand(count, 3, low=-0.2, high=0.2, shared=True).double()
    views[:, 2, 3] += 3.0
    views[:, 3, 3] = 1.0
    side = min(s["width"], s["height"])
    ks = torch.zeros(count, 3, 3, dtype=torch.float64, device=ctx.device)
    focal = 0.8 * side * ctx.rand(count, low=0.9, high=1.1, shared=True).double()
    ks[:, 0, 0], ks[:, 1, 1] = focal, focal
    ks[:, 0, 2] = 0.5 * s["width"] + ctx.rand(count, low=-0.02, high=0.02, shared=True).double() * side
    ks[:, 1, 2] = 0.5 * s["height"] + ctx.rand(count, low=-0.02, high=0.02, shared=True).double() * side
    ks[:, 2, 2] = 1.0
    return views.float(), ks.float()


def _gaussians(ctx, n):
    """means, quats, scales, opacities, colors (float32): the first CORE * n in the central cube."""
    core = int(CORE * n)
    box = torch.tensor([2.4, 2.4, 0.6], device=ctx.device if not ctx.is_meta else "cpu")
    means = ctx.rand(n, 3, low=-1.0, high=1.0)
    if not ctx.is_meta:
        means[:core] *= 0.35
        means[core:] *= box
    return (
        means,
        ctx.randn(n, 4),
        ctx.rand(n, 3, low=0.0, high=0.02),
        ctx.rand(n, low=0.1, high=0.9),
        ctx.rand(n, 3),
    )


def _near_a_cutoff(gaussians, views, ks, s):
    """[N] bool: the Gaussians that, in some camera, lie within the margins of a discrete decision."""
    means, quats, scales = (t.double() for t in gaussians[:3])
    extent, means2d, depths, _ = _project(
        means, quats, scales, views.double(), ks.double(), s["width"], s["height"], EPS2D
    )
    radii, _ = _keep(extent, means2d, depths, s["width"], s["height"], NEAR, FAR)
    near_integer = (extent - extent.round()).abs() < RADIUS_MARGIN
    r = radii.double()
    size = torch.tensor([s["width"], s["height"]], dtype=torch.float64, device=means.device)
    edges = torch.cat([means2d + r, means2d - r - size], dim=-1).abs() < EDGE_MARGIN
    depth = ((depths - NEAR).abs() < 1e-3)[..., None]
    return torch.cat([near_integer, edges, depth], dim=-1).any(dim=-1).any(dim=0)


def make_inputs(ctx):
    """Shared cameras (this rank's C of them); Gaussians redrawn until none is near a cutoff."""
    s = ctx.size
    n, c = s["gaussians"], s["cameras"]
    views, ks = _cameras(ctx, c * ctx.world_size)
    gaussians = list(_gaussians(ctx, n))
    if not ctx.is_meta:
        for _ in range(50):
            redraw = _near_a_cutoff(gaussians, views, ks, s)
            if not bool(redraw.any()):
                break
            fresh = _gaussians(ctx, n)
            for i, t in enumerate(fresh):
                gaussians[i] = torch.where(redraw.view(-1, *[1] * (t.dim() - 1)), t, gaussians[i])
        else:
            raise RuntimeError("Gaussians stayed near a cutoff after 50 draws")
    mine = slice(ctx.rank * c, (ctx.rank + 1) * c)
    return (
        *gaussians,
        views[mine].contiguous(),
        ks[mine].contiguous(),
        s["width"],
        s["height"],
        EPS2D,
        NEAR,
        FAR,
        "pinhole",
    )


PAYLOAD = 14  # words a visible pair carries: 4 int32 (camera, Gaussian, 2 radii) + 10 float32
# (the ids travel as int32 and are returned as int64, the original's dtype)


@torch.no_grad()
def solution(
    means,
    quats,
    scales,
    opacities,
    colors,
    viewmats,
    Ks,
    image_width,
    image_height,
    eps2d=0.3,
    near_plane=0.01,
    far_plane=1e10,
    camera_model="pinhole",
):
    assert camera_model == "pinhole"
    w, r = dist.get_world_size(), dist.get_rank()
    n, c = means.shape[0], viewmats.shape[0]
    # every rank's Gaussian count and cameras, in one gather
    mine = torch.cat([means.new_tensor([float(n)]), viewmats.reshape(-1), Ks.reshape(-1)])
    every = mine.new_empty(w * mine.numel())  # flat: gloo gathers only into a [W * k] buffer
    _all_gather(every, mine)
    every = every.view(w, -1)
    counts = every[:, 0].long()
    views = every[:, 1 : 1 + 16 * c].reshape(w * c, 4, 4)
    ks = every[:, 1 + 16 * c :].reshape(w * c, 3, 3)

    extent, means2d, depths, conics = _project(
        means, quats, scales, views, ks, image_width, image_height, eps2d
    )
    radii, visible = _keep(extent, means2d, depths, image_width, image_height, near_plane, far_plane)
    cam, gid = visible.nonzero(as_tuple=True)  # camera-major: grouped by the camera's owner
    start = counts[:r].sum()
    ints = torch.stack([cam % c, gid + start], dim=-1).int()
    ints = torch.cat([ints, radii[cam, gid]], dim=-1)
    floats = torch.cat(
        [means2d[cam, gid], depths[cam, gid, None], conics[cam, gid], opacities[gid, None], colors[gid]],
        dim=-1,
    )
    send = torch.cat([ints.view(torch.float32), floats], dim=-1)
    send_counts = visible.view(w, c * n).sum(dim=1)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    split_in, split_out = send_counts.tolist(), recv_counts.tolist()
    got = send.new_empty(sum(split_out), PAYLOAD)
    dist.all_to_all_single(got, send, output_split_sizes=split_out, input_split_sizes=split_in)
    ints = got[:, :4].contiguous().view(torch.int32)
    return (
        ints[:, 0].long(),
        ints[:, 1].long(),
        ints[:, 2:4].contiguous(),
        got[:, 4:6].contiguous(),
        got[:, 6].contiguous(),
        got[:, 7:10].contiguous(),
        got[:, 10].contiguous(),
        got[:, 11:14].contiguous(),
    )


def canonical(outputs, inputs):
    """Every output's rows sorted by (camera, Gaussian): the pairs in one order, whatever order a
    solution sends and receives them in (each pair occurs once, so the key has no ties)."""
    key = outputs[0].long() * (1 << 32) + outputs[1].long()
    order = key.argsort()
    return tuple(t[order] for t in outputs)


def traffic(ctx):
    """Per GPU, a lower bound, the least over two schedules (tests/test_problems_fft_splat.py
    checks both), each peer's share counting only the CORE * N Gaussians every camera sees:
    (a) send the peer every Gaussian unprojected (mean 3, covariance 6, opacity 1, colors 3: 13
        float32), the peer culling them itself: N * 52 bytes;
    (b) gather the cameras (25 float32 each), cull on the sender and send each visible Gaussian's
        opacity and colors once and its projection per camera (2D mean 2, depth 1, conic 3; the
        radii follow from the conic): 100 C + core * min(52, 16 + 24 C) bytes.
    The reference sends 14 words per visible pair, ids included. HBM: the inputs read, the core
    pairs' output rows (14 words) written. FLOPs: 80 per core pair (its 2D covariance)."""
    s, w = ctx.size, ctx.world_size
    n, c = s["gaussians"], s["cameras"]
    core = int(CORE * n)
    per_peer = min(n * 52, 100 * c + core * min(52, 16 + 24 * c))
    return {
        "nvlink_bytes": (w - 1) * per_peer,
        "hbm_bytes": n * 14 * 4 + c * 25 * 4 + w * core * c * PAYLOAD * 4,
        "flops": 80 * core * w * c,
        "rounds": 1,
    }


# How a file written for the original benchmark is called (harness/convention.py): the inputs
# are the original's call tuple.
ORIGINAL = {
    "signature": "solution(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor, "
    "viewmats: Tensor, Ks: Tensor, image_width: int, image_height: int, eps2d: float = 0.3, "
    "near_plane: float = 0.01, far_plane: float = 10000000000.0, camera_model: str = 'pinhole') "
    "-> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]",
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call and the outputs are the original's. float32 throughout (the original projects in "
        "bfloat16); random cameras per rank and trial, C per rank (the original gives every rank the "
        "identity camera); 1/4 of the Gaussians in a wider slab, so that some are culled, and every "
        "Gaussian redrawn away from the cutoffs (radius ceiling, image border); gaussian_ids offset "
        "by the Gaussian's own rank (the original adds the receiving rank's offset, so ids from "
        "different ranks collide); outputs judged sorted by (camera, Gaussian)."
    ),
}
