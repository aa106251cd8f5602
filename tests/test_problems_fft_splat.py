"""PhysicsNeMo's distributed rfft2 and irfft2 (59, 60) and gsplat's distributed projection (61).

Fast tier: the original's signature and call are tests/test_problems.py's; its shapes hold on the meta
device at both sizes, its world-size rule says what it should, its traffic model is no larger than
the schedules a solution could choose instead, and what the CPU runs cannot show directly holds:
60's inputs are a real field's spectrum and its reference's shortcut is the original's completion,
61's Gaussians are clear of every cutoff and its central ones visible in every camera, and its
canonical order is a sort by (camera, Gaussian).
Integration tier (real ranks on CPU, process sandbox): candidates written in the original's
convention pass in both variants at world sizes 2 and 4 (61's with the fix its problem states; as
the original, it fails on gaussian_ids), a float64 irfft2 passes 60 (its tolerance holds), and
solutions that skip an exchange fail as wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs, problem

IDS = [59, 60, 61]
BY_PROBLEM = CANDIDATES / "by_problem"


# ---------------------------------------------------------------- fast: format, shapes, rules


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_meta_shapes_and_traffic(pid, preset, world_size):
    p = problem(pid)
    assert p.world_size_error(world_size, preset) is None
    shapes = p.input_shapes(world_size, preset)
    assert any("shape" in s for s in shapes)
    traffic = p.traffic(world_size, preset)
    assert traffic["nvlink_bytes"] > 0 and traffic["hbm_bytes"] > 0 and traffic["flops"] > 0


def test_pkb_shapes_are_the_originals_at_world_size_8():
    def shapes(pid, variant="pkb"):
        return [(s.get("shape"), s.get("dtype")) for s in problem(pid, variant).input_shapes(8, "pkb")]

    for variant in ("pkb", "original"):
        assert shapes(59, variant)[0] == ([16, 1024, 128], "float32")
        assert shapes(60, variant)[0] == ([2, 10, 90, 721], "complex64")
    f32 = "float32"
    splat = [[1024, 3], [1024, 4], [1024, 3], [1024], [1024, 3], [1, 4, 4], [1, 3, 3]]
    assert shapes(61)[:7] == [(shape, f32) for shape in splat]
    assert shapes(61, "original")[0] == ([1024, 3], "bfloat16")
    # the original's shapes at other world sizes: 59 rounds its field up, 60 keeps H = 720
    assert problem(59, "original").input_shapes(3, "pkb")[0]["shape"] == [16, 1026, 342]
    assert problem(60, "original").input_shapes(2, "pkb")[0]["shape"] == [2, 10, 360, 721]


@pytest.mark.parametrize(
    ("pid", "variant", "world_size", "allowed"),
    [
        (59, "pkb", 3, True),  # rows rounded up to 1026
        (59, "original", 3, True),
        (60, "pkb", 3, True),  # 1440 columns
        (60, "pkb", 7, False),
        (60, "pkb", 32, True),  # H = 90 W: only the columns bound W
        (60, "original", 7, False),  # 720 rows
        (60, "original", 32, False),
        (61, "pkb", 3, True),
        (61, "pkb", 1, False),
    ],
)
def test_world_size_rules(pid, variant, world_size, allowed):
    assert (problem(pid, variant).world_size_error(world_size, "pkb") is None) == allowed


def test_59_rows_are_rounded_up_as_the_original_rounds():
    x, s, *_ = cpu_inputs(59, 3, rank=2)
    assert tuple(x.shape) == (16, 1026, 128) and s == (1026, 384)
    assert not torch.equal(x, cpu_inputs(59, 3, rank=1)[0]), "each rank draws its own columns"


@pytest.mark.parametrize("world_size", [2, 3])
def test_60_inputs_are_a_real_fields_spectrum_and_the_shortcut_is_the_completion(world_size):
    """Columns 0 and L / 2 are Hermitian-consistent across the ranks' rows (so the whole is the
    rfft2 of a real field), their imaginary parts are not zero, and the reference's weighted
    transform equals the original's Hermitian completion and torch.fft.irfft2 (float64)."""
    size = {"batch": 1, "channels": 2, "rows_local": 5, "cols": 12}
    p = problem(60)
    parts = []
    for rank in range(world_size):
        ctx = p.context(world_size, "pkb", rank=rank, device="cpu")
        ctx.size, ctx.seed = size, 3
        parts.append(p.module.make_inputs(ctx)[0])
    x = torch.cat(parts, dim=-2).to(torch.complex128)
    h, length = 5 * world_size, 12
    mirror = (-torch.arange(h)) % h
    for col in (0, length // 2):
        assert torch.allclose(x[..., col], x[..., mirror, col].conj(), atol=1e-7)
        assert float(x[..., 1:, col].imag.abs().max()) > 0.1
    completed = torch.zeros(1, 2, h, length, dtype=torch.complex128)
    completed[..., : length // 2 + 1] = x
    for m in range(1, length // 2):
        completed[..., length - m] = x[..., mirror, m].conj()
    want = torch.fft.ifft(torch.fft.ifft(completed, dim=-1, norm="ortho"), dim=-2, norm="ortho").real
    weight = torch.full((length // 2 + 1,), 2.0, dtype=torch.float64)
    weight[0] = weight[-1] = 1.0
    got = torch.fft.ifft(torch.fft.ifft(x * weight, n=length, dim=-1, norm="ortho"), dim=-2, norm="ortho")
    assert float((got.real - want).abs().max()) < 1e-12
    assert float((torch.fft.irfft2(x, s=(h, length), norm="ortho") - want).abs().max()) < 1e-12


@pytest.mark.parametrize("seed", [1, 2])
def test_61_gaussians_clear_of_cutoffs_and_central_ones_seen_by_every_camera(seed):
    """At W = 4: every rank's Gaussians are clear of every discrete cutoff in every camera (float64
    check), its central CORE share is visible in all of them (the traffic model counts on it),
    some of the rest are culled, and every rank's camera differs."""
    world_size = 4
    p = problem(61)
    m = p.module
    size = p.size("pkb")
    ctx = p.context(world_size, "pkb", rank=0, device="cpu")
    ctx.seed = seed
    views, ks = m._cameras(ctx, world_size)
    core = int(m.CORE * size["gaussians"])
    for rank in range(world_size):
        inputs = cpu_inputs(61, world_size, rank, seed=seed)
        assert torch.equal(inputs[5], views[rank : rank + 1]) and torch.equal(inputs[6], ks[rank : rank + 1])
        assert not bool(m._near_a_cutoff(inputs[:3], views, ks, size).any())
        extent, means2d, depths, _ = m._project(
            *inputs[:3], views, ks, size["width"], size["height"], m.EPS2D
        )
        _, visible = m._keep(extent, means2d, depths, size["width"], size["height"], m.NEAR, m.FAR)
        assert bool(visible[:, :core].all())
        assert 0.2 < float(visible[:, core:].float().mean()) < 0.9
    assert len({tuple(views[r].flatten().tolist()) for r in range(world_size)}) == world_size


def test_61_canonical_sorts_every_output_by_camera_then_gaussian():
    m = problem(61).module
    cams = torch.tensor([1, 0, 1, 0])
    gids = torch.tensor([3, 7, 2, 9])
    outputs = (cams, gids, torch.arange(8).view(4, 2).int(), torch.rand(4, 2), torch.rand(4))
    got = m.canonical(outputs, ())
    order = [1, 3, 2, 0]  # (0, 7), (0, 9), (1, 2), (1, 3)
    assert got[0].tolist() == [0, 0, 1, 1] and got[1].tolist() == [7, 9, 2, 3]
    for g, o in zip(got, outputs, strict=True):
        assert torch.equal(g, o[order])


# ---------------------------------------------------------------- fast: traffic against alternatives


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("preset", ["pkb", "large"])
def test_traffic_is_no_more_than_the_alternatives(world_size, preset):
    w = world_size

    # 59: the column-transformed row blocks (complex64), or the real field gathered
    p = problem(59)
    s = p.size(preset)
    h = -(-s["rows"] // w) * w
    block = s["batch"] * h * s["cols_local"]
    t = p.traffic(w, preset)["nvlink_bytes"]
    assert t == (w - 1) / w * block * 8 <= (w - 1) * block * 4

    # 60: the row-transformed column blocks (complex64), the half spectrum gathered, or the
    # original's all-gather of the padded rows
    p = problem(60)
    s = p.size(preset)
    if p.world_size_error(w, preset) is None:
        field = s["batch"] * s["channels"] * s["rows_local"] * s["cols"]
        half = s["batch"] * s["channels"] * s["rows_local"] * (s["cols"] // 2 + 1)
        t = p.traffic(w, preset)["nvlink_bytes"]
        assert t == (w - 1) / w * field * 8 < (w - 1) * half * 8 < (w - 1) * field * 8

    # 61: each Gaussian unprojected (13 float32 a peer), or the reference's 14 words a visible
    # pair; the central share alone is a lower bound on the visible pairs
    p = problem(61)
    s = p.size(preset)
    core = int(p.module.CORE * s["gaussians"])
    t = p.traffic(w, preset)["nvlink_bytes"]
    assert t <= (w - 1) * s["gaussians"] * 13 * 4
    assert t <= (w - 1) * (25 * 4 * s["cameras"] + core * s["cameras"] * p.module.PAYLOAD * 4)


# ---------------------------------------------------------------- integration: real ranks on CPU


def check(pid: int, path: Path, world_size: int, variant: str = "pkb"):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=1,
            timeout_s=600,
            sandbox="process",
            variant=variant,
        )
    )


def fixed_61(tmp_path: Path) -> Path:
    """061_original_style.py with the fix problem 61 states: ids offset by the sender's rank."""
    path = tmp_path / "061_sender_offsets.py"
    text = (BY_PROBLEM / "061_original_style.py").read_text()
    assert 'OFFSET_BY = "receiver"' in text
    path.write_text(text.replace('OFFSET_BY = "receiver"', 'OFFSET_BY = "sender"'))
    return path


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["pkb", "original"])
@pytest.mark.parametrize(("pid", "world_size"), [(59, 2), (59, 4), (60, 2), (60, 4), (61, 2), (61, 4)])
def test_original_style_candidate_passes(tmp_path, variant, pid, world_size):
    path = BY_PROBLEM / f"{pid:03d}_original_style.py"
    if pid == 61 and variant == "pkb":
        path = fixed_61(tmp_path)
    r = check(pid, path, world_size, variant)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
def test_61_original_ids_fail_for_the_stated_difference():
    """As the original, the ids take the receiver's offset: they collide, and gaussian_ids (the
    second output) is the first to differ; the radii, means and attributes are right (above)."""
    r = check(61, BY_PROBLEM / "061_original_style.py", 2)
    assert r.verdict == "fail"
    for rank in r.ranks:
        assert rank.state == "wrong" and rank.first_mismatch is not None and rank.first_mismatch.output == 1


@pytest.mark.integration
def test_60_float64_candidate_passes():
    r = check(60, BY_PROBLEM / "060_float64.py", 4)
    assert r.verdict == "pass", r.message


# solutions that skip the exchange: the other ranks' columns (59) or rows (60) taken as zero, so
# the shapes are right and the values wrong
FFT_MUTANTS = {
    59: (
        "w, r = dist.get_world_size(), dist.get_rank()\n"
        "    full = x.new_zeros(x.shape[0], s[0], s[1])\n"
        "    full[:, :, r * x.shape[2] : (r + 1) * x.shape[2]] = x\n"
        "    return torch.fft.rfft2(full, norm=norm)[:, r * s[0] // w : (r + 1) * s[0] // w].contiguous()"
    ),
    60: (
        "w, r = dist.get_world_size(), dist.get_rank()\n"
        "    full = x.new_zeros(*x.shape[:-2], s[0], x.shape[-1])\n"
        "    full[..., r * x.shape[-2] : (r + 1) * x.shape[-2], :] = x\n"
        "    out = torch.fft.irfft2(full, s=tuple(s), norm=norm)\n"
        "    return out[..., r * s[1] // w : (r + 1) * s[1] // w].contiguous()"
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("pid", sorted(FFT_MUTANTS))
def test_fft_without_the_exchange_fails(tmp_path, pid):
    path = tmp_path / f"{pid:03d}_no_exchange.py"
    path.write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        f"def solution(x, s, dim, norm='ortho', group=None):\n    {FFT_MUTANTS[pid]}\n"
    )
    r = check(pid, path, 2)
    assert r.verdict == "fail" and [rank.state for rank in r.ranks] == ["wrong", "wrong"], r.message
    assert all(rank.rel_norm_error is not None and rank.rel_norm_error > 0.3 for rank in r.ranks)


# 61 without the camera all-gather (every rank takes its own camera for all: the original's
# identical cameras allowed it) or without the all-to-all (a rank keeps its own camera's pairs)
SPLAT_MUTANTS = {
    "no_camera_gather": ("    dist.all_gather(every, cams)\n", "    every = [cams] * world\n"),
    "no_all_to_all": (
        "    dist.all_to_all_single(joined, packed, output_split_sizes=incoming, input_split_sizes=sizes)\n",
        "    joined = packed.split(sizes)[dist.get_rank()]\n",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("mutant", sorted(SPLAT_MUTANTS))
def test_61_without_an_exchange_fails(tmp_path, mutant):
    old, new = SPLAT_MUTANTS[mutant]
    text = fixed_61(tmp_path).read_text()
    assert old in text
    path = tmp_path / f"061_{mutant}.py"
    path.write_text(text.replace(old, new))
    r = check(61, path, 2)
    assert r.verdict == "fail" and [rank.state for rank in r.ranks] == ["wrong", "wrong"], r.message
