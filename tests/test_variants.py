"""The two variants of a workload (docs/variants.md): the original's files load and are refused when
malformed, every front end chooses the variant, and (integration) files in the original's convention
pass the original workload as the original harness judges it."""

from pathlib import Path

import pytest

from pkb_mcp import problems, render, service
from pkb_mcp.errors import UserError
from pkb_mcp.frontends import cli
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES, ROOT

ORIGINAL = problems.suite("original")


def test_every_problem_has_its_original_variant_under_its_own_id_and_name():
    assert sorted(ORIGINAL) == sorted(problems.suite()), "a problem comes with its original file"
    ours = problems.suite()
    for pid, p in ORIGINAL.items():
        assert (p.variant, p.name, p.category) == ("original", ours[pid].name, ours[pid].category)
        assert p.path.parent.name == "original" and set(p.sizes) == {"pkb"}
        # the original harness's tolerance: allclose at 1e-2, no norm bound
        assert (p.tolerance["atol"], p.tolerance["rtol"], p.tolerance["rel_norm"]) == (
            0.01,
            0.01,
            float("inf"),
        )
        if pid <= 8:
            assert "What a solution could skip" in p.description, "constant inputs: say what is knowable"


def test_the_original_s_shapes_follow_the_world_size_as_its_builder_makes_them():
    assert ORIGINAL[7].input_shapes(2, "pkb")[0]["shape"] == [2048, 1024]
    assert ORIGINAL[7].input_shapes(8, "pkb")[0]["shape"] == [8192, 1024]
    assert ORIGINAL[5].input_shapes(4, "pkb", rank=0)[0]["shape"] == [4, 1024, 1024]
    assert ORIGINAL[5].input_shapes(4, "pkb", rank=1)[0]["shape"] == [1024, 1024]
    assert ORIGINAL[4].input_shapes(2, "pkb")[1] == {"name": "dst", "value": "0"}


def test_the_original_s_inputs_are_its_constants():
    import torch

    ctx = ORIGINAL[8].context(4, "pkb", rank=2, device="cpu")
    (blocks,) = ORIGINAL[8].module.make_inputs(ctx)
    assert [float(b[0, 0]) for b in blocks] == [20.0, 21.0, 22.0, 23.0]
    ctx = ORIGINAL[1].context(4, "pkb", rank=3, device="cpu")
    assert torch.equal(
        ORIGINAL[1].module.make_inputs(ctx)[0], torch.full((1024, 1024), 4.0, dtype=torch.bfloat16)
    )


def test_a_problem_without_its_original_file_or_an_unknown_variant_is_one_sentence(tmp_path, monkeypatch):
    (tmp_path / "original").mkdir()  # a suite whose problem 1 has no original file
    (tmp_path / "001_allreduce.py").write_text(problems.resolve(1).path.read_text())
    monkeypatch.setenv("PKB_PROBLEMS_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"problem 1 \(allreduce\) has no original variant yet"):
        problems.resolve(1, "original")
    monkeypatch.delenv("PKB_PROBLEMS_DIR")
    with pytest.raises(UserError, match="problem 999 does not exist"):
        problems.resolve(999, "original")
    with pytest.raises(UserError, match="variant 'paper' is not one of pkb, original"):
        problems.resolve(1, "paper")
    assert problems.resolve("allreduce", "original").path.parent.name == "original"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace(
                'SIZES = {"pkb": {"rows": 1024, "cols": 1024}}', 'SIZES = {"pkb": {}, "large": {}}'
            ),
            "one preset, 'pkb'",
        ),
        (lambda t: t.replace('NAME = "allreduce"', 'NAME = "allreduce_x"'), "do not match the file name"),
    ],
)
def test_a_malformed_original_file_is_refused_naming_it(tmp_path, edit, message):
    path = tmp_path / "001_allreduce.py"
    path.write_text(edit(ORIGINAL[1].path.read_text()))
    with pytest.raises(problems.ProblemFormatError, match=message):
        problems.load_problem(path, "original")


def test_an_original_file_must_be_a_problem_of_the_suite(tmp_path, monkeypatch):
    root = tmp_path / "problems"
    (root / "original").mkdir(parents=True)
    (root / "001_allreduce.py").write_text(problems.suite()[1].path.read_text())
    (root / "original" / "002_allgather.py").write_text(ORIGINAL[2].path.read_text())
    monkeypatch.setenv("PKB_PROBLEMS_DIR", str(root))
    with pytest.raises(
        problems.ProblemFormatError, match=r"original/002_allgather\.py: no problem 2 of that name"
    ):
        problems.suite("original")


def test_show_and_roofline_take_the_variant():
    detail = service.show_problem(7, world_size=2, variant="original")
    assert detail.variant == "original" and detail.original is None
    assert detail.inputs[0].shape == [2048, 1024] and "original variant" in render.show(detail)
    assert service.show_problem(7, world_size=2).original is not None, "pkb's states its differences"
    ours, theirs = service.roofline_of(7, 2), service.roofline_of(7, 2, variant="original")
    # the same workload shape at W = 2: one block of 1024 x 1024 bf16 leaves each GPU
    assert theirs.traffic.nvlink_bytes == 1024 * 1024 * 2 == ours.traffic.nvlink_bytes


def test_the_cli_maps_variant_onto_the_run_request(tmp_path):
    args = cli.build_parser().parse_args(["check", "1", str(tmp_path / "x.py"), "--variant", "original"])
    assert cli._request(args).variant == "original"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["show", "1", "--variant", "paper"])


# ---------------------------------------------------------------- integration: real ranks on CPU

OWN_ORIGINAL_FILES = CANDIDATES / "original"


def _check(pid: int, path: Path, variant: str):
    return service.check(
        RunRequest(
            problem=pid,
            path=str(path),
            world_size=2,
            device="cpu",
            trials=1,
            variant=variant,
            sandbox="process",
        )
    )


@pytest.mark.integration
@pytest.mark.parametrize("pid", [1, 3, 4, 6, 7, 8, 12, 20])
def test_a_file_in_the_original_s_convention_passes_the_original_workload(pid):
    """Our files written the original's way (tests/candidates/original). Problem 2's returns
    [W * rows, cols] where the original returns [W, rows, cols]: judged exactly, it fails there.
    12's and 20's are refused by the `pkb` variant, which redesigned those workloads
    (tests/test_convention.py)."""
    (path,) = OWN_ORIGINAL_FILES.glob(f"{pid:03d}_*.py")
    r = _check(pid, path, "original")
    assert r.verdict == "pass", r.message


@pytest.mark.integration
def test_a_protection_the_original_lacks_still_fails_a_file_in_the_original_variant():
    """005_scatter_torch.py scatters into its input on the other ranks and returns it: right by the
    original's rules (it compares values only), failed by pkb's aliasing and mutation checks, which
    the original variant keeps and names (docs/variants.md, pkb_mcp/runs/protections.py)."""
    r = _check(5, OWN_ORIGINAL_FILES / "005_scatter_torch.py", "original")
    assert r.verdict == "fail" and r.protections == ["aliasing", "mutation"], r.message
    assert r.message == (
        "correct by the original benchmark's rules; fails pkb's: aliasing: rank 1, trial 0: output 0 "
        "shares memory with an input; mutation: rank 1, trial 0: input 0 was changed by the solution"
    )
    assert [(x.rank, x.state) for x in r.ranks] == [(0, "pass"), (1, "wrong")]


@pytest.mark.integration
def test_the_original_s_constant_inputs_let_a_solution_skip_the_exchange(tmp_path):
    """What `pkb show --variant original` says a solution could skip: at rank + 1 fills, the sum is
    known without communicating. Such a file passes the original workload and fails pkb's."""
    path = tmp_path / "001_allreduce_torch.py"
    path.write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        "def solution(tensor):\n"
        "    w = dist.get_world_size()\n"
        "    return torch.full_like(tensor, w * (w + 1) / 2)\n"
    )
    assert _check(1, path, "original").verdict == "pass"
    assert _check(1, path, "pkb").verdict == "fail"


def test_the_all_gathers_nccl_takes_and_gloo_refuses_run_on_cpu_as_nccl_runs_them():
    """A 0-dim all_gather_into_tensor, one into [W, ...] and an all_gather of unequal sizes, as the
    original's 61 and 81 make them: gloo refuses each, the CPU ranks run them as NCCL does."""
    result = _check(1, CANDIDATES / "gathers_as_nccl.py", "pkb")
    assert result.verdict == "pass", result.message


ORIGINAL_REFERENCES = ROOT.parent / "shared" / "pkb-original" / "reference"


# the original's own reference files that gloo refused before harness/gloo_as_nccl.py
GLOO_REFUSED = [
    "2_allgather",
    "11_allgather_gemm_AT",
    "26_moe_token_preprocess",
    "61_gsplat_3d_gaussian_splatting",
    "81_sam3_allgather_iou_suppression",
]


@pytest.mark.integration
@pytest.mark.skipif(
    not ORIGINAL_REFERENCES.is_dir(), reason="the original benchmark's files are not beside the repository"
)
@pytest.mark.parametrize("stem", GLOO_REFUSED)
def test_the_original_s_own_references_that_gloo_refused_pass_their_variant_on_cpu(stem):
    """Their gathers into [W, ...], of 0-dim tensors and of unequal sizes (docs/variants.md)."""
    result = _check(int(stem.split("_")[0]), ORIGINAL_REFERENCES / f"{stem}.py", "original")
    assert result.verdict == "pass", result.message
