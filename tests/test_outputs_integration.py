"""The wave-C1 capabilities end to end, on a tiny problem written into the test's own suite (world
size 2, one trial, the process sandbox): an output with None, a torch.Size and a dict of an int and
a tensor of data-dependent size; an nn.Linear argument; lean inputs; a host-synchronous reference
whose host share shows in a benchmark's result."""

from pathlib import Path

import pytest

from pkb_mcp import problems, service
from pkb_mcp.errors import UserError
from pkb_mcp.models import RunRequest
from pkb_mcp.runs.run import LEAN_NOTE

pytestmark = pytest.mark.integration

PROBLEM = '''"""A linear layer summed over ranks; returns the sum, None, its shape and a dict (tests only)."""

import torch
import torch.distributed as dist

ID = 901
NAME = "tiny_mixed"
CATEGORY = "primitive"
SOURCE = "tests"
SUMMARY = "tests only"
DTYPE = "float32"
WORLD_SIZES = "any world size >= 2"
SIZES = {"pkb": {"rows": 16}, "large": {"rows": 64}}
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4, "rel_norm": 1e-4}
LEAN_INPUTS = True


def check_world_size(world_size, size):
    return None if world_size >= 2 else "needs at least 2 ranks"


def make_inputs(ctx):
    lin = torch.nn.Linear(8, 4, device=ctx.device)
    with torch.no_grad():
        lin.weight.copy_(ctx.randn(4, 8, shared=True))
        lin.bias.copy_(ctx.randn(4, shared=True))
    return (ctx.randn(ctx.size["rows"], 8), lin)


def solution(x, lin):
    with torch.no_grad():
        y = lin(x)
    dist.all_reduce(y)
    count = int((y > 0).sum().item())  # the host waits on the device here
    return y, None, y.shape, {"positive": count, "head": y[: count % 4 + 1].clone()}


def traffic(ctx):
    return {"nvlink_bytes": 0, "hbm_bytes": 0, "flops": 0}
'''

MUTATES_WEIGHT = """
_reference = solution


def solution(x, lin):
    out = _reference(x, lin)
    with torch.no_grad():
        lin.weight[0, 0] += 1.0
    return out
"""

TENSOR_FOR_NONE = """
_reference = solution


def solution(x, lin):
    y, _, shape, extra = _reference(x, lin)
    return y, torch.zeros(1), shape, extra
"""


@pytest.fixture
def suite(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "901_tiny_mixed.py").write_text(PROBLEM)
    monkeypatch.setenv("PKB_PROBLEMS_DIR", str(folder))
    return folder


def check(path: Path):
    return service.check(
        RunRequest(
            problem=901, path=path, world_size=2, device="cpu", trials=1, timeout_s=180, sandbox="process"
        )
    )


def test_mixed_outputs_module_inputs_and_lean_inputs_are_judged(suite, tmp_path):
    reference = suite / "901_tiny_mixed.py"
    r = check(reference)
    assert r.verdict == "pass", r.message
    assert LEAN_NOTE in r.notes
    mutates = tmp_path / "mutates.py"
    mutates.write_text(PROBLEM + MUTATES_WEIGHT)
    r = check(mutates)
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks), r.message
    assert "input 1 (Linear) parameter weight was changed by the solution" in r.ranks[0].message
    wrong_none = tmp_path / "wrong_none.py"
    wrong_none.write_text(PROBLEM + TENSOR_FOR_NONE)
    r = check(wrong_none)
    assert r.verdict == "fail" and "output 1: expected None, got tensor" in r.ranks[0].message, r.message


def test_a_host_synchronous_reference_shows_its_host_share(suite):
    r = service.bench(
        RunRequest(
            problem=901, path=suite / "901_tiny_mixed.py", world_size=2, device="cpu", sandbox="process"
        )
    )
    assert r.verdict == "pass", r.message
    assert r.reference is not None and r.candidate is not None
    for side in (r.reference, r.candidate):
        assert side.host_clock_median_ms is not None and side.host_clock_median_ms > 0
        assert side.input_sets == 1, "lean inputs: one replayed input set"
    assert LEAN_NOTE in r.notes


def tiny_problem(folder: Path, pid: int, name: str, body: str, dtype: str = "float32") -> Path:
    """A test problem file `pid_name.py` in `folder`: the metadata every problem needs, then `body`
    (make_inputs, solution and whatever the capability under test adds)."""
    head = f'''"""A tiny problem of the harness tests ({name})."""

import torch
import torch.distributed as dist

ID = {pid}
NAME = "{name}"
CATEGORY = "primitive"
SOURCE = "tests"
SUMMARY = "tests only"
DTYPE = "{dtype}"
WORLD_SIZES = "any world size >= 2"
SIZES = {{"pkb": {{"n": 16}}, "large": {{"n": 64}}}}
TOLERANCE = {{"atol": 1e-4, "rtol": 1e-4, "rel_norm": 1e-4}}


def check_world_size(world_size, size):
    return None if world_size >= 2 else "needs at least 2 ranks"


def traffic(ctx):
    return {{"nvlink_bytes": 0, "hbm_bytes": 0, "flops": 0}}

'''
    path = folder / f"{pid:03d}_{name}.py"
    path.write_text(head + body)
    return path


def check_file(pid: int, path: Path):
    return service.check(
        RunRequest(
            problem=pid, path=path, world_size=2, device="cpu", trials=1, timeout_s=180, sandbox="process"
        )
    )


COMPLEX = """
def make_inputs(ctx):
    n = ctx.size["n"]
    weights = ctx.rand(n, low=0.5, high=1.5, dtype=torch.complex64, shared=True)
    return ctx.randn(n, dtype=torch.complex64), weights


def solution(x, w):
    y = x * w
    dist.all_reduce(y)
    return y
"""

REAL_PART_ONLY = """
_reference = solution


def solution(x, w):
    return _reference(x, w).real.to(torch.complex64)
"""


def test_complex_inputs_and_outputs_are_judged_on_both_parts(suite, tmp_path):
    reference = tiny_problem(suite, 902, "tiny_complex", COMPLEX, dtype="complex64")
    r = check_file(902, reference)
    assert r.verdict == "pass", r.message
    wrong = tmp_path / "real_part_only.py"
    wrong.write_text(reference.read_text() + REAL_PART_ONLY)
    r = check_file(902, wrong)
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks), r.message


CANONICAL = """
def make_inputs(ctx):
    return (ctx.randn(ctx.size["n"], 3),)


def solution(x):
    rows = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, x)
    return torch.cat(rows), x.shape[0]


def canonical(outputs, inputs):
    rows, count = outputs
    return rows[rows[:, 0].argsort()], count
"""

OTHER_ORDER = """
def solution(x):
    rows = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, x)
    return torch.cat(rows[::-1]).flip(0), x.shape[0]
"""


def test_outputs_in_another_order_pass_through_the_canonical_order(suite, tmp_path):
    reference = tiny_problem(suite, 903, "tiny_canonical", CANONICAL)
    other = tmp_path / "other_order.py"
    other.write_text(reference.read_text() + OTHER_ORDER)
    r = check_file(903, other)
    assert r.verdict == "pass", r.message
    r = service.bench(
        RunRequest(problem=903, path=other, world_size=2, device="cpu", sandbox="process", timeout_s=300)
    )
    assert r.verdict == "pass", r.message
    unordered = reference.read_text().replace("def canonical(", "def _unused(")
    reference.write_text(unordered)
    r = check_file(903, other)
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks), r.message


SPARSE = """
import warnings

warnings.filterwarnings("ignore", message="Sparse invariant checks")


def make_inputs(ctx):
    n = ctx.size["n"]
    mask = ctx.rand(n, n, dtype=torch.float32) < 0.3
    weights = (ctx.randn(n, n, dtype=torch.float32) * mask).to_sparse()
    return weights, ctx.randn(n, 4, dtype=torch.float32)


def solution(weights, x):
    y = torch.sparse.mm(weights, x)
    dist.all_reduce(y)
    return y, weights * 2
"""

SPARSE_UNCOALESCED = """
_reference = solution


def solution(weights, x):
    y, doubled = _reference(weights, x)
    # the same entries, each split in two halves: uncoalesced, equal once coalesced
    i, v = doubled._indices(), doubled._values()
    return y, torch.sparse_coo_tensor(torch.cat([i, i], 1), torch.cat([v, v]) / 2, doubled.shape)
"""

SPARSE_MUTATES = """
_reference = solution


def solution(weights, x):
    out = _reference(weights, x)
    weights._values().mul_(2)
    return out
"""


def test_sparse_inputs_and_outputs_are_judged(suite, tmp_path):
    reference = tiny_problem(suite, 904, "tiny_sparse", SPARSE)
    uncoalesced = tmp_path / "uncoalesced.py"
    uncoalesced.write_text(reference.read_text() + SPARSE_UNCOALESCED)
    r = check_file(904, uncoalesced)
    assert r.verdict == "pass", r.message
    mutates = tmp_path / "mutates.py"
    mutates.write_text(reference.read_text() + SPARSE_MUTATES)
    r = check_file(904, mutates)
    assert r.verdict == "fail" and "input 0 (sparse values) was changed" in r.ranks[0].message, r.message
    r = service.bench(
        RunRequest(problem=904, path=reference, world_size=2, device="cpu", sandbox="process", timeout_s=300)
    )
    assert r.verdict == "pass", r.message


LISTS_IN_PLACE = """
MUTATES_INPUTS = True


def make_inputs(ctx):
    return [ctx.randn(ctx.size["n"]), ctx.randn(ctx.size["n"], 2)], 0.5


def solution(shards, scale):
    for s in shards:
        dist.all_reduce(s)
        s.mul_(scale)
    return torch.stack([s.norm() for s in shards])
"""

FIRST_SHARD_ONLY = """
def solution(shards, scale):
    for s in shards:
        dist.all_reduce(s)
    shards[0].mul_(scale)
    return torch.stack([s.norm() * (scale if i else 1.0) for i, s in enumerate(shards)])
"""


def test_tensors_in_a_list_are_copied_per_call_and_judged_after_an_update_in_place(suite, tmp_path):
    reference = tiny_problem(suite, 905, "tiny_lists", LISTS_IN_PLACE)
    r = service.bench(
        RunRequest(problem=905, path=reference, world_size=2, device="cpu", sandbox="process", timeout_s=300)
    )
    assert r.verdict == "pass", r.message  # a list updated twice would change the timed outputs
    partial = tmp_path / "first_shard_only.py"
    partial.write_text(reference.read_text() + FIRST_SHARD_ONLY)
    r = check_file(905, partial)
    assert r.verdict == "fail" and "output 2" in r.ranks[0].message, r.message


MANY_OUTPUTS = """
MAX_OUTPUTS = 80  # tests: 70 outputs, over the default 64


def make_inputs(ctx):
    return (ctx.randn(70, ctx.size["n"]),)


def solution(x):
    y = x.clone()
    dist.all_reduce(y)
    return list(y.unbind(0))
"""


def test_a_problem_raises_the_output_cap_with_max_outputs(suite):
    reference = tiny_problem(suite, 906, "tiny_many", MANY_OUTPUTS)
    r = check_file(906, reference)
    assert r.verdict == "pass", r.message
    reference.write_text(reference.read_text().replace("MAX_OUTPUTS = 80", "_UNUSED = 80"))
    problems._loaded.cache_clear()  # each problem file is loaded once per process
    with pytest.raises(UserError, match="lists 70 tensors, over the cap of 64"):
        check_file(906, reference)
