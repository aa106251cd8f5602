"""A solution whose parameters no call of its problem can bind is refused before any launch, naming the
expected signatures (pkb_mcp/runs/signature.py); every file that can be called is let through: the
suite's own references in both variants, the original variant's files against the pkb variant, our
candidates and examples, and whatever cannot be judged from the text."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pkb_mcp import problems, service
from pkb_mcp.errors import UserError
from pkb_mcp.frontends import cli
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import pairing, run, signature

from .conftest import CANDIDATES, ROOT

WORLD_SIZES = (2, 4, 8)
GEMV = 46  # gemv_decode: three inputs in both conventions
ONE_PARAMETER = "def solution(x):\n    return x\n"
GEMV_REFUSAL = (
    "solution takes 1 parameter (x) here; expected solution(hidden_states, weight_local, bias_local) "
    "(ours, 3 arguments) or solution(hidden_states: torch.Tensor, weight_shard: torch.Tensor, "
    "bias_shard: torch.Tensor) -> torch.Tensor (the original benchmark's, 3 arguments)"
)


def refusal(pid: int, source: str, world_size: int = 2, convention: str = "auto", variant: str = "pkb"):
    p = problems.resolve(pid, variant)
    return signature.mismatch(p, ast.parse(source), world_size, "pkb", convention)


def runs(p: problems.Problem) -> list[tuple[int, str]]:
    return [(w, s) for s in p.sizes for w in WORLD_SIZES if not p.world_size_error(w, s)]


@pytest.mark.parametrize("variant", problems.VARIANTS)
def test_every_reference_is_judged_and_binds_its_own_call(variant):
    suite = problems.suite(variant)
    assert len(suite) == 87
    for pid, p in suite.items():
        tree = ast.parse(p.path.read_bytes())
        assert len(signature.solution_functions(tree)) == 1, f"{p.path.name}: its solution is not judged"
        assert runs(p), pid
        for world_size, size in runs(p):
            assert signature.possible_calls(p, world_size, size, "auto"), (pid, world_size, size)
            assert signature.mismatch(p, tree, world_size, size) is None, (pid, world_size, size)


def test_the_original_variant_s_files_bind_in_the_pkb_variant():
    """Each is written to the original's signature: the pkb variant calls it that way (or, where the
    original's call cannot produce our outputs, lets it through to the sandbox's stated reason)."""
    for pid, original in problems.suite("original").items():
        tree = ast.parse(original.path.read_bytes())
        p = problems.resolve(pid)
        for world_size, size in runs(p):
            assert signature.mismatch(p, tree, world_size, size) is None, (pid, world_size, size)


def test_our_candidates_and_examples_are_let_through():
    files = [*CANDIDATES.rglob("*.py"), *(ROOT / "examples").rglob("*.py")]
    judged = 0
    for path in files:
        paired = pairing.pair(path).problem
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        if paired is None or not signature.solution_functions(tree):
            continue
        judged += 1
        for world_size in WORLD_SIZES:
            if not paired.world_size_error(world_size, "pkb"):
                assert signature.mismatch(paired, tree, world_size, "pkb") is None, (path, world_size)
    assert judged > 100


def test_a_one_parameter_solution_of_a_three_argument_problem_names_both_signatures():
    assert refusal(GEMV, ONE_PARAMETER) == GEMV_REFUSAL
    # asked for one convention, only that call is possible and named
    ours = refusal(GEMV, ONE_PARAMETER, convention="ours")
    assert ours is not None and "original" not in ours and "(ours, 3 arguments)" in ours
    only_original = refusal(GEMV, ONE_PARAMETER, convention="original")
    assert only_original is not None and "ours" not in only_original
    # the original variant makes our call only, with its own reference's signature
    assert refusal(1, "def solution(a, b):\n    pass\n", variant="original") == (
        "solution takes 2 parameters (a, b) here; expected solution(tensor) (ours, 1 argument)"
    )


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("def solution(*args):\n    pass\n", False),
        ("def solution(*args, **kwargs):\n    pass\n", False),
        ("def solution(x, *rest):\n    pass\n", False),
        ("def solution(a, b, c, d=1):\n    pass\n", False),
        ("def solution(a, /, b, c):\n    pass\n", False),
        ("async def solution(a, b, c):\n    pass\n", False),
        ("@torch.no_grad()\ndef solution(a, b, c):\n    pass\n", False),
        ("@torch.no_grad()\ndef solution(a):\n    pass\n", True),
        ("@torch.inference_mode\ndef solution(a):\n    pass\n", True),
        ("def solution(a, b):\n    pass\n", True),
        ("def solution(a, b, c, d):\n    pass\n", True),
        ("def solution(**kwargs):\n    pass\n", True),
        ("def solution(a, b, c, *, scale):\n    pass\n", True),  # a keyword-only parameter is never given
        ("def solution(a, b, c, *, scale=1.0):\n    pass\n", False),
        ("def solution(a, b, c):\n    pass\ndef solution(a):\n    pass\n", True),  # the last def wins
        ("def solution(a):\n    pass\ndef solution(a, b, c):\n    pass\n", False),
        (
            "if X:\n    def solution(a):\n        pass\nelse:\n    def solution(a, b, c):\n        pass\n",
            False,
        ),
        ("try:\n    def solution(a):\n        pass\nexcept Exception:\n    pass\n", True),
        # what the text cannot tell: let through, the sandbox judges
        ("solution = lambda a: a\n", False),
        ("def f(a):\n    pass\nsolution = torch.compile(f)\n", False),
        ("@torch.compile\ndef solution(a):\n    pass\n", False),
        ("@functools.lru_cache\ndef solution(a):\n    pass\n", False),
        ("class solution:\n    def __init__(self, a):\n        pass\n", False),
        ("from mine import solution\n", False),
        ("from mine import *\ndef solution(a):\n    pass\n", False),
        ("def solution(a):\n    pass\nglobals()['solution'] = print\n", False),
        ("def solution(a):\n    pass\nsolution.__code__ = g.__code__\n", False),
        ("def solution(a):\n    pass\ndef later():\n    global solution\n", False),
        ("def solution(a):\n    pass\nfor solution in []:\n    pass\n", False),
        ("def make():\n    def solution(a):\n        pass\n", False),  # not the module's: nothing judged
    ],
)
def test_what_binds_what_does_not_and_what_cannot_be_told(source, refused):
    assert (refusal(GEMV, source) is not None) is refused, source


def test_a_problem_that_cannot_make_the_original_s_call_lets_a_file_written_to_it_through():
    """Problem 12's ORIGINAL has no args (its workload differs): the sandbox refuses such a file naming
    the difference, so the host does not refuse it first, nor offer that call as expected."""
    assert refusal(12, "def solution(A_local, B):\n    pass\n") is None
    assert refusal(12, "def solution(A_local, B):\n    pass\n", convention="original") is None
    said = refusal(12, ONE_PARAMETER)
    assert said is not None and "original" not in said and "(ours, 2 arguments)" in said


def _no_launch(*args, **kwargs):
    raise AssertionError("a launch was made for a solution refused by its signature")


@pytest.fixture
def no_launch(monkeypatch):
    """Every launch of check, bench and profile is made by Run.launch_request (its extensions' builds by
    Run.prepare_extensions): either one called fails the test."""
    monkeypatch.setattr(run.Run, "launch_request", _no_launch)
    monkeypatch.setattr(run.Run, "prepare_extensions", _no_launch)


def test_the_refusal_comes_before_any_launch_through_the_cli(tmp_path, capsys, no_launch):
    (tmp_path / "one.py").write_text(ONE_PARAMETER)
    argv = ["check", str(GEMV), str(tmp_path / "one.py"), "--device", "cpu", "--world-size", "2"]
    # bad input (issue 51): exit 2, one sentence, JSON under --json; no run header, no table of ranks
    assert cli.main([*argv, "--sandbox", "process", "--json"]) == cli.EXIT_USAGE
    assert json.loads(capsys.readouterr().out) == {"error": GEMV_REFUSAL}
    request = RunRequest(problem=GEMV, path=str(tmp_path / "one.py"), world_size=2, device="cpu")
    for verb in (service.check, service.bench, service.profile):
        with pytest.raises(UserError) as refused:
            verb(request.model_copy(update={"sandbox": "process"}))
        assert str(refused.value) == GEMV_REFUSAL


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_refusal_is_the_same_sentence_through_mcp(tmp_path, no_launch, anyio_backend):
    from mcp import Client

    from pkb_mcp.frontends.server import build_server
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore

    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    try:
        async with Client(build_server(scheduler, tmp_path / "sources")) as client:
            args = {"problem": str(GEMV), "source": ONE_PARAMETER, "world_size": 2, "device": "cpu"}
            called = await client.call_tool("run_correctness", args)
    finally:
        scheduler.stop()
    assert called.is_error and called.structured_content == {"error": GEMV_REFUSAL}


def test_the_problem_s_call_counts_come_from_its_inputs(tmp_path: Path):
    calls = signature.possible_calls(problems.resolve(22), 2, "pkb", "auto")
    assert [(c.label, c.counts) for c in calls] == [("ours", (3,)), ("the original benchmark's", (8,))]
    assert signature.possible_calls(problems.resolve(22), 2, "pkb", "ours")[0].counts == (3,)
