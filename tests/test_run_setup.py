"""What a run refuses before any launch (pkb_mcp/runs/run.py): world sizes, devices, time limits and
solution files, and what a failed rank or a failed reference says to the user. No sandbox runs here."""

from __future__ import annotations

import pytest
import torch

from pkb_mcp import problems
from pkb_mcp.errors import UserError
from pkb_mcp.launches import LaunchOutcome, RankOutcome
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import run

NO_GPU = not torch.cuda.is_available()


def test_world_size_must_be_positive_and_allowed_by_the_problem():
    allgather_gemm = problems.resolve(12)
    run.check_world_size(allgather_gemm, 4, "pkb")
    with pytest.raises(UserError, match="world size 0 is not positive; pass --world-size 2 or more"):
        run.check_world_size(allgather_gemm, 0, "pkb")
    with pytest.raises(UserError) as refused:
        run.check_world_size(allgather_gemm, 3, "pkb")
    message = str(refused.value)
    assert message.startswith("problem 12 (allgather_gemm) cannot run at world size 3 with size 'pkb'")
    assert f"(rule: {allgather_gemm.world_sizes})" in message


def test_preflight_resolves_the_problem_and_keeps_the_device_asked_for():
    problem, device = run.preflight("allreduce", 2, "pkb", "cpu")
    assert problem.id == 1 and device == "cpu"
    _, default = run.preflight(1, 2, "pkb", None)
    assert default == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((99, 2, "pkb", "cpu"), "problem 99 does not exist; see pkb problems"),
        ((1, 2, "huge", "cpu"), "no size preset 'huge'"),
        ((12, 3, "pkb", "cpu"), "cannot run at world size 3"),
    ],
)
def test_preflight_refuses_with_one_sentence(args, words):
    with pytest.raises(UserError) as refused:
        run.preflight(*args)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda', not 'tpu'"),
        ({"timeout_s": 0.0}, "timeout (seconds) must be more than 0 and at most 3600, not 0.0"),
        ({"timeout_s": -5}, "timeout (seconds) must be more than 0 and at most 3600, not -5"),
        ({"world_size": 0}, "world size must be between 1 and 64, not 0"),
        ({"trials": 101}, "trials must be between 1 and 100, not 101"),
        ({"launches": 0}, "launches must be between 1 and 8, not 0"),
        ({"calls": 21}, "calls must be between 1 and 20, not 21"),
        ({"sandbox": "vm"}, "sandbox must be 'auto', 'docker' or 'process', not 'vm'"),
        ({"variant": "v2"}, "variant must be 'pkb' or 'original', not 'v2'"),
        ({"problem": 1, "surprise": 1}, "surprise: "),
    ],
)
def test_a_request_refuses_a_value_its_rules_forbid_in_one_sentence(given, words):
    with pytest.raises(UserError) as refused:
        RunRequest.of(path="x.py", **given)
    assert str(refused.value).startswith(words), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_unless_a_cluster_runs_it():
    with pytest.raises(UserError, match="no CUDA GPU is visible on this machine; pass --device cpu"):
        run.preflight(1, 2, "pkb", "cuda")
    problem, device = run.preflight(1, 2, "pkb", "cuda", local_gpus=False)
    assert (problem.id, device) == (1, "cuda")


def test_cpu_runs_hold_no_gpus():
    assert run.gpus_for("cpu", 8) == []


def test_a_solution_file_must_exist_and_be_a_reasonable_size(tmp_path):
    with pytest.raises(UserError, match=r"does not exist; pass the path of a \.py file defining solution"):
        run.read_solution(tmp_path / "missing.py")
    empty = tmp_path / "empty.py"
    empty.write_text("")
    with pytest.raises(UserError, match="is empty"):
        run.read_solution(empty)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (run.MAX_SOLUTION_BYTES + 1))
    with pytest.raises(UserError, match=f"over the {run.MAX_SOLUTION_BYTES}-byte limit"):
        run.read_solution(big)
    at_limit = tmp_path / "at_limit.py"
    body = b"def solution(x):\n    return x\n"
    at_limit.write_bytes(body + b"#" * (run.MAX_SOLUTION_BYTES - len(body)))
    assert run.read_solution(at_limit) is None
    with pytest.raises(UserError, match=r"is a directory, not a \.py file"):
        run.read_solution(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# notes\n")
    with pytest.raises(UserError, match=r"README\.md is not a \.py file"):
        run.read_solution(readme)


def test_a_syntax_error_is_a_candidate_failure_with_file_and_line(tmp_path):
    """Parsed as text on the host (never imported): a syntax error is the candidate's, not the user's."""
    bad = tmp_path / "sol.py"
    bad.write_text("def solution(x):\n    return x +\n")
    assert run.read_solution(bad) == "the solution does not parse: sol.py:2: invalid syntax"
    nul = tmp_path / "nul.py"
    nul.write_bytes(b"x = 1\x00\n")
    message = run.read_solution(nul)
    assert message is not None and message.startswith("the solution does not parse: nul.py")
    good = tmp_path / "good.py"
    good.write_text("import os\nos.system('never run on the host')\ndef solution(x):\n    return x\n")
    assert run.read_solution(good) is None
    for bound in ("from mine import solution\n", "solution = lambda x: x\n", "from mine import *\n"):
        (tmp_path / "bound.py").write_text(bound)
        assert run.read_solution(tmp_path / "bound.py") is None, bound
    (tmp_path / "none.py").write_text("def solve(x):\n    return x\n")
    assert run.read_solution(tmp_path / "none.py") == (
        "none.py defines no solution(): a candidate is a module whose solution(...) takes the reference's "
        "inputs (pkb show ID prints the signature)"
    )


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (
            RankOutcome(0, "error", error="ValueError: bad\nmore", stage="trial 1"),
            "raised ValueError: bad during trial 1",
        ),
        (RankOutcome(0, "error", error="KeyError: 'x'"), "raised KeyError: 'x'"),
        (RankOutcome(1, "crashed", signal="SIGSEGV"), "crashed (SIGSEGV)"),
        (RankOutcome(1, "crashed", error="exit status 3"), "crashed (exit status 3)"),
        (RankOutcome(1, "crashed"), "crashed (no status)"),
        (RankOutcome(0, "timeout"), "still running at the deadline (deadlock or too slow); killed"),
        (RankOutcome(0, "timeout", stage="starting"), run.NOT_STARTED),
        (
            RankOutcome(0, "aborted"),
            "killed after another rank failed (it was likely waiting in a collective)",
        ),
        (RankOutcome(0, "exited"), "exited with status 0 before finishing the launch"),
    ],
)
def test_each_rank_state_reads_as_a_sentence(outcome, message):
    assert run.rank_result(outcome).message == message


def test_rank_result_keeps_the_first_line_of_an_error_and_the_end_of_its_log():
    outcome = RankOutcome(
        2,
        "error",
        error="RuntimeError: " + "x" * 1000 + "\nsecond line",
        traceback="Traceback ...",
        log_tail="a" * 5000 + "END",
        ended_s=1.5,
    )
    result = run.rank_result(outcome)
    assert result.rank == 2 and result.state == "error"
    assert result.message == "raised " + ("RuntimeError: " + "x" * 1000)[:300]
    assert result.traceback == "Traceback ..."
    assert result.log_tail is not None and len(result.log_tail) == 2000 and result.log_tail.endswith("END")
    assert result.ended_s == 1.5
    empty = run.rank_result(RankOutcome(0, "crashed"))
    assert empty.traceback is None and empty.log_tail is None and empty.ended_s is None


def test_a_failed_reference_names_the_first_failing_rank_and_blames_the_environment():
    outcome = LaunchOutcome(
        ranks=[
            RankOutcome(0, "ok"),
            RankOutcome(1, "error", error="RuntimeError: NCCL error", log_tail="..." + "L" * 1000),
            RankOutcome(2, "aborted"),
        ],
        wall_s=1.0,
        timed_out=False,
    )
    error = run.reference_failed(problems.resolve(1), outcome)
    text = str(error)
    assert text.startswith("the reference of problem 1 failed on rank 1 (RuntimeError: NCCL error)")
    assert "check the device and world size" in text
    assert text.endswith("L" * 400) and "..." not in text


@pytest.mark.parametrize(("stage", "why"), [("", ""), ("starting", " (its ranks were still starting")])
def test_a_reference_that_met_its_deadline_is_a_timeout_not_the_environment(stage, why):
    """Issue 51: a reference launch killed at its deadline read "failed on rank 0 (timeout)... the
    environment cannot run this problem" with an empty log; it is a timeout, with its limit."""
    outcome = LaunchOutcome(
        ranks=[RankOutcome(0, "timeout", stage=stage), RankOutcome(1, "timeout", stage=stage)],
        wall_s=30.0,
        timed_out=True,
    )
    message = str(run.reference_failed(problems.resolve(1), outcome, 30.0))
    assert message.startswith(
        f"timeout: the reference of problem 1 did not finish within its 30 s limit{why}"
    )
    assert message.endswith("the time limit is too short for this machine: raise it")
    assert "environment" not in message and len(message.splitlines()) == 1
