"""The suite loads, every problem keeps the format's promises, and malformed files are refused by name."""

import inspect

import pytest
import torch

from pkb_mcp import catalogue, config, problems
from pkb_mcp.errors import UserError

from .problems_common import CALLS, Kind, problem

SUITE = problems.suite()
IDS = sorted(SUITE)
ISSUE_2_IDS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 18]


def test_the_first_twelve_are_present():
    assert set(ISSUE_2_IDS) <= set(IDS)


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_inputs_shapes_and_traffic(pid, preset, world_size):
    p = SUITE[pid]
    if p.world_size_error(world_size, preset):
        pytest.skip(f"world size {world_size} not allowed for {p.name} {preset}")
    shapes = p.input_shapes(world_size, preset)
    assert shapes and all("shape" in s or "value" in s for s in shapes)
    traffic = p.traffic(world_size, preset)
    assert traffic["hbm_bytes"] > 0 and traffic["nvlink_bytes"] > 0
    assert p.world_size_error(1, preset), "a single rank has nothing to communicate"


@pytest.mark.parametrize("pid", IDS)
def test_inputs_are_random_and_differ_by_rank_and_seed(pid):
    p = SUITE[pid]
    ws = 2 if not p.world_size_error(2, "pkb") else 4

    def inputs(rank, seed):
        ctx = p.context(ws, "pkb", rank=rank, device="cpu")
        ctx.seed = seed
        # a sparse input's values (62's psi: its pattern is the workload's, the same every trial)
        return [
            t.coalesce().values() if t.layout == torch.sparse_coo else t
            for t in p.module.make_inputs(ctx)
            if isinstance(t, torch.Tensor)
        ]

    a, b, c = inputs(0, 1), inputs(1, 1), inputs(0, 2)
    for t in a:
        if t.dtype.is_floating_point and t.numel() > 1:  # a 0-dim draw (63's error) has no spread
            assert t.float().std() > 0, "no constant fills"
    assert any(not torch.equal(x, y) for x, y in zip(a, b, strict=True)), "ranks get different inputs"
    assert all(not torch.equal(x, y) for x, y in zip(a, c, strict=True)), "every trial gets new inputs"
    assert all(torch.equal(x, y) for x, y in zip(a, inputs(0, 1), strict=True)), "seeded: reproducible"


GOOD = (config.problems_dir() / "001_allreduce.py").read_text()


def test_the_catalogue_read_as_text_agrees_with_the_loaded_suite():
    """`pkb problems` lists what the suite loads, word for word, without importing a problem."""
    entries = catalogue.entries()
    assert sorted(entries) == IDS
    for pid, p in SUITE.items():
        entry = entries[pid]
        fields = ("name", "category", "source", "summary", "description", "dtype", "world_sizes", "path")
        assert [getattr(entry, f) for f in fields] == [getattr(p, f) for f in fields], p.name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD.replace('SOURCE = "torch.distributed"', 'SOURCE = "torch." + "distributed"'),
            "SOURCE must be a literal",
        ),
        (GOOD.replace('SUMMARY = "', 'SUMMARY = 3  # "'), "SUMMARY must be <class 'str'>"),
        (GOOD.replace("WORLD_SIZES = ", "_WORLD_SIZES = "), "missing WORLD_SIZES"),
        (
            GOOD.replace('WORLD_SIZES = "any world size >= 2"\n', "")
            + '\nWORLD_SIZES = "any world size >= 2"\n',
            r"missing WORLD_SIZES \(before the first function\)",
        ),
    ],
)
def test_a_problem_the_catalogue_cannot_read_does_not_load(tmp_path, text, message):
    path = tmp_path / "001_allreduce.py"
    path.write_text(text)
    for read in (catalogue.read_entry, problems.load_problem):
        with pytest.raises(problems.ProblemFormatError, match=message) as info:
            read(path)
        assert str(info.value).startswith("001_allreduce.py")


def test_a_word_changed_after_the_first_function_is_refused(tmp_path):
    """The catalogue reads the file's head; the loader holds the imported words to it."""
    path = tmp_path / "001_allreduce.py"
    path.write_text(GOOD + '\nSUMMARY = "another"\n')
    assert "another" not in catalogue.read_entry(path).summary
    with pytest.raises(
        problems.ProblemFormatError, match=r"001_allreduce\.py: SUMMARY changed after the first"
    ):
        problems.load_problem(path)


def test_lookup_by_id_name_and_padded_id():
    assert problems.resolve(1).name == "allreduce"
    assert problems.resolve("001").id == 1
    assert problems.resolve("allgather_gemm").id == 12
    with pytest.raises(UserError, match="problem 999 does not exist; see pkb problems"):
        problems.resolve(999)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("001_allreduce.py", GOOD.replace("ID = 1\n", "ID = 2\n"), "do not match the file name"),
        ("001_allreduce.py", GOOD.replace('"large"', '"huge"'), "needs a 'large' preset"),
        (
            "001_allreduce.py",
            GOOD.replace("def traffic(ctx):", "def _traffic(ctx):"),
            "missing function traffic",
        ),
        ("001_allreduce.py", GOOD.replace('DTYPE = "bfloat16"', 'DTYPE = "bf16"'), "DTYPE 'bf16'"),
        ("001_allreduce.py", GOOD.replace('"rel_norm": 0.005', '"rel_norm": -1'), "non-negative 'rel_norm'"),
        ("001_allreduce.py", GOOD + "\nimport nonexistent_module\n", "cannot be imported"),
        ("1_allreduce.py", GOOD, "named NNN_slug.py"),
        ("001_allreduce.py", GOOD + "\ncanonical = 3\n", "canonical must be a function"),
        ("001_allreduce.py", GOOD + "\nMAX_OUTPUTS = 2000\n", "MAX_OUTPUTS must be an int from 64"),
        ("001_allreduce.py", GOOD + "\nMAX_OUTPUTS = 80.0\n", "MAX_OUTPUTS must be an int"),
        ("001_allreduce.py", GOOD + "\ndef canonical(outputs):\n    return outputs\n", "two arguments"),
    ],
)
def test_malformed_problem_is_refused_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(problems.ProblemFormatError, match=message) as info:
        problems.load_problem(path)
    assert str(info.value).startswith(name)


@pytest.mark.parametrize(
    ("tolerance", "message"),
    [
        ('{"atol": 0.1, "rtol": 0.1, "rel_norm": 0.1, "outputs": {"0": {}}}', "maps output indices"),
        ('{"atol": 0.1, "rtol": 0.1, "rel_norm": 0.1, "outputs": {0: {"atol": 1}}}', "exactly atol"),
        (
            '{"atol": 0.1, "rtol": 0.1, "rel_norm": 0.1, '
            '"outputs": {0: {"atol": 1, "rtol": 1, "rel_norm": -1}}}',
            r"TOLERANCE\['outputs'\]\[0\] needs a non-negative 'rel_norm'",
        ),
        ('{"atol": 0.1, "rtol": 0.1, "rel_norm": 0.1, "rel": 1}', "unknown keys"),
    ],
)
def test_per_output_bounds_are_validated(tmp_path, tolerance, message):
    path = tmp_path / "001_allreduce.py"
    path.write_text(
        GOOD.replace(
            'TOLERANCE = {"atol": 0.05, "rtol": 0.02, "rel_norm": 0.005}', f"TOLERANCE = {tolerance}"
        )
    )
    with pytest.raises(problems.ProblemFormatError, match=message):
        problems.load_problem(path)


def test_per_output_bounds_load_and_show():
    from pkb_mcp import render, service

    p = SUITE[21]
    assert 0 in p.output_tolerances and p.bounds["outputs"][0] == p.output_tolerances[0]
    detail = service.show_problem(21, world_size=2)
    assert detail.tolerance["outputs"][0] == p.output_tolerances[0]
    assert "output 0: {'atol': 0.0, 'rtol': 0.0002" in render.show(detail)


def test_gpu_tests_pick_a_world_size_each_problem_allows():
    """tests/test_gpu.py ran every problem at 2 ranks, and 48 (4 or more ranks) failed there."""
    from .test_gpu import world_size_for

    assert world_size_for(48, gpus=2) is None and world_size_for(48, gpus=8) == 4
    for pid, p in SUITE.items():
        ws = world_size_for(pid, gpus=8)
        assert ws is not None and not p.world_size_error(ws, "pkb"), pid
        assert all(p.world_size_error(w, "pkb") for w in range(2, ws)), "the smallest allowed"


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_constant_fill_may_be_a_0_dim_tensor(device):
    """The original's problem 23 passes 0-dim token counts; on the meta device (pkb show) too."""
    from harness.context import ProblemContext

    ctx = ProblemContext(rank=0, world_size=2, size={}, device=torch.device(device))
    t = ctx.full((), 7, dtype=torch.int64)
    assert t.shape == () and t.dtype == torch.int64 and t.device.type == device
    assert ctx.full((2, 3), 1.0).shape == (2, 3)


def test_a_canonical_order_hook_loads(tmp_path):
    path = tmp_path / "001_allreduce.py"
    path.write_text(GOOD + "\ndef canonical(outputs, inputs):\n    return outputs\n")
    assert callable(problems.load_problem(path).module.canonical)


def test_max_outputs_raises_the_result_file_cap(tmp_path):
    path = tmp_path / "001_allreduce.py"
    path.write_text(GOOD + "\nMAX_OUTPUTS = 80  # tests: a workload of 80 outputs\n")
    assert problems.load_problem(path).max_outputs == 80
    assert SUITE[1].max_outputs == 64


@pytest.mark.parametrize("variant", ["pkb", "original"])
@pytest.mark.parametrize("pid", sorted(CALLS))
def test_a_problem_takes_the_original_s_signature_and_call(pid, variant):
    """Both variants: `solution` has the original's parameters and defaults, and make_inputs returns
    the whole call its builder passes (its shapes' sizes, built on the meta device), constants
    included; a `pkb` variant states how it differs."""
    call, p = CALLS[pid], problem(pid, variant)
    signature = inspect.signature(p.module.solution).parameters
    assert [(name, q.default) for name, q in signature.items()] == call.params
    if variant == "pkb":
        assert "Differences from the original:" in p.description
    got = tuple(p.module.make_inputs(p.context(call.world_size, "pkb")))  # on the meta device
    assert len(got) == len(call.values)
    for i, (value, want) in enumerate(zip(got, call.values, strict=True)):
        if isinstance(want, Kind):
            assert want.holds(value), f"argument {i}: {type(value).__name__}, not {want.name}"
        else:
            assert value == want and type(value) is type(want), f"argument {i}: {value!r}, not {want!r}"
