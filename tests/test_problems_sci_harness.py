"""Problem 63 (DeePMD-kit's LKF optimizer step): the original's call, per-rank shapes, world-size
rule, inputs where the exchange matters, floors; and, through the real harness on CPU, the reference
and a file in the original's convention passing in both variants, and a solution that skips the
all-reduce failing in pkb's variant (and passing in the original's, as its docstring says)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from harness.context import ProblemContext
from pkb_mcp import problems, service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES

SUITE = problems.suite()
ORIGINALS = problems.suite("original")
P63 = SUITE[63]
STYLE = CANDIDATES / "by_problem" / "063_original_style.py"


def test_63_takes_the_original_s_call():
    params = inspect.signature(P63.module.solution).parameters
    assert list(params) == ["H", "error", "weights", "P", "kalman_lambda", "kalman_nue"]
    assert params["kalman_nue"].default == 0.9987
    assert P63.mutates_inputs and P63.max_outputs > 64 and ORIGINALS[63].max_outputs > 64


@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_63_shapes_on_meta_and_traffic(preset, world_size):
    s = P63.size(preset)
    n, b = s["blocks"], s["block"]
    inputs = P63.module.make_inputs(P63.context(world_size, preset))
    h, error, w, p, lam, nue = inputs
    assert [t.shape for t in h] == [(b, 1)] * n and [t.shape for t in w] == [(b, 1)] * n
    assert [t.shape for t in p] == [(b, b)] * n and error.shape == () and (lam, nue) == (0.98, 0.9987)
    assert all(t.dtype == torch.float64 for t in [*h, *w, *p, error])
    t = P63.traffic(world_size, preset)
    # an all-gather of every rank's n x b float64 weights: each GPU receives the W - 1 others'
    assert t["nvlink_bytes"] >= (world_size - 1) * n * b * 8
    assert t["hbm_bytes"] >= 2 * n * b * b * 8 and t["rounds"] == 2
    if preset == "pkb":
        shapes = ORIGINALS[63].module.make_inputs(ORIGINALS[63].context(world_size, "pkb"))
        assert [x.shape for x in shapes[3]] == [(1024, 1024)] * 8


def test_63_world_size_rule():
    assert P63.world_size_error(1, "pkb") is not None
    assert P63.world_size_error(8, "pkb") is None
    assert "MAX_OUTPUTS" in (P63.world_size_error(200, "pkb") or "")


def lkf(inputs_per_rank, exchange=True):
    """The step on every rank's inputs at once (no process group): A from all ranks' sums, or each
    rank's own where `exchange` is False. Returns each rank's new weights and P."""
    sums = [sum(0.98 + float(h.T @ p @ h) for h, p in zip(x[0], x[3], strict=True)) for x in inputs_per_rank]
    out = []
    for r, (hs, err, ws, ps, lam, _) in enumerate(inputs_per_rank):
        a = 1 / (sum(sums) if exchange else sums[r])
        ks = [p @ h for h, p in zip(hs, ps, strict=True)]
        new_w = [w + a * err * k for w, k in zip(ws, ks, strict=True)]
        new_p = [(p - a * k @ k.T) / lam for p, k in zip(ps, ks, strict=True)]
        out.append((torch.cat(new_w), torch.stack(new_p)))
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_63_skipping_the_all_reduce_is_far_outside_the_tolerance(world_size):
    size = {"blocks": 2, "block": 128}
    inputs = [
        P63.module.make_inputs(ProblemContext(r, world_size, size, torch.float64, seed=11))
        for r in range(world_size)
    ]
    tol = P63.tolerance
    for (w, p), (w_local, p_local) in zip(lkf(inputs), lkf(inputs, exchange=False), strict=True):
        for good, bad in ((w, w_local), (p, p_local)):
            assert (bad - good).abs().max() > 1e4 * (tol["atol"] + tol["rtol"] * good.abs().max())
            assert (bad - good).norm() / good.norm() > 1e4 * tol["rel_norm"]
    # the original's inputs (its 8 blocks): the same shortcut stays inside its bounds of 1e-2
    size = {"blocks": 8, "block": 128}
    originals = [
        ORIGINALS[63].module.make_inputs(ProblemContext(r, world_size, size, torch.float64, seed=11))
        for r in range(world_size)
    ]
    for (w, p), (w_local, p_local) in zip(lkf(originals), lkf(originals, exchange=False), strict=True):
        assert torch.allclose(w_local, w, atol=1e-2, rtol=1e-2) and torch.allclose(
            p_local, p, atol=1e-2, rtol=1e-2
        )


def check(path: Path, world_size: int, variant: str = "pkb"):
    return service.check(
        RunRequest(
            problem=63,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=1,
            timeout_s=600,
            sandbox="process",
            variant=variant,
        )
    )


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("variant", ["pkb", "original"])
def test_63_the_reference_and_the_original_style_file_pass(world_size, variant):
    reference = (ORIGINALS if variant == "original" else SUITE)[63].path
    for path in (reference, STYLE):
        r = check(path, world_size, variant)
        assert r.verdict == "pass", (path.name, r.message)


@pytest.mark.integration
def test_63_a_solution_that_skips_the_all_reduce_fails_in_pkb_s_variant_only(tmp_path):
    local = tmp_path / "063_local.py"
    text = STYLE.read_text()
    assert "    dist.all_reduce(total)\n" in text
    local.write_text(text.replace("    dist.all_reduce(total)\n", "    pass  # each rank's own sum\n"))
    r = check(local, 2)
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks), r.message
    assert check(local, 2, "original").verdict == "pass"
