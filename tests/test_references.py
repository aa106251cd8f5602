"""Reference outcomes made ahead (pkb_mcp/runs/references.py): while a batch expects more checks of a
problem, a check's reference launch also runs the next checks' reference trials, and a later check
takes one instead of launching its reference.

Fast: the stock's bookkeeping (taken once, as many as expected and at most AHEAD, none too large,
dropped when the batch ends) and the batch's counts. Integration: three checks in a row through the
harness (the process backend standing in for an isolated one): the first launch prepares the next
two, which launch only their candidates and are judged as before, a wrong candidate included."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from pkb_mcp import problems, service
from pkb_mcp.evaluation import batch
from pkb_mcp.launches import LaunchOutcome, Outputs
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import pairing, references
from pkb_mcp.runs import run as run_module
from pkb_mcp.runs.references import AHEAD, MAX_BYTES, Prepared, Stock
from sandbox.process import ProcessBackend

from .conftest import CANDIDATES

P1 = problems.suite()[1]
SHAPE = (str(P1.path), '[[], {}, 5, true, "docker"]')


def prepared(nbytes: int = 8) -> Prepared:
    outcome = LaunchOutcome(ranks=[], wall_s=0.1, timed_out=False)
    outcome.outputs = {(0, 0): Outputs("tensor", [torch.zeros(nbytes, dtype=torch.uint8)], {})}
    return Prepared([1, 2, 3, 4, 5], outcome)


@pytest.mark.fast
def test_a_prepared_reference_is_taken_once_and_only_while_expected():
    stock = Stock()
    assert stock.wanted(SHAPE) == 0, "no batch expects the problem"
    stock.put(SHAPE, [prepared()])
    assert stock.take(SHAPE) is None, "nothing kept while none is expected"
    with stock.expecting({str(P1.path): 3}):
        assert stock.wanted(SHAPE) == 3
        assert stock.take(SHAPE) is None, "the first check finds none, and counts as come"
        assert stock.wanted(SHAPE) == 2
        first, second = prepared(), prepared()
        stock.put(SHAPE, [first, second])
        assert stock.wanted(SHAPE) == 0
        assert stock.take(SHAPE) is first and stock.take(SHAPE) is second
        assert stock.take(SHAPE) is None, "each taken once"
        other = (SHAPE[0], SHAPE[1].replace('"docker"', '"process"'))
        stock.put(other, [prepared()])
    assert stock.take(other) is None, "what is left goes with the batch"


@pytest.mark.fast
def test_at_most_ahead_are_prepared_and_none_too_large():
    stock = Stock()
    with stock.expecting({str(P1.path): 50}):
        assert stock.wanted(SHAPE) == AHEAD
        stock.put(SHAPE, [prepared()])
        assert stock.wanted(SHAPE) == AHEAD - 1
        other = (SHAPE[0], SHAPE[1].replace('"docker"', '"process"'))
        stock.put(other, [prepared(), prepared(MAX_BYTES + 1)])
        assert stock.take(other) is None, "outputs too large to hold in memory: none kept"
        assert stock.wanted(other) == 0, "nor prepared again"
    with stock.expecting({str(P1.path): 2}):  # the next batch tries again
        assert stock.wanted(other) == 2


@pytest.mark.fast
def test_a_batch_expects_one_check_for_each_file_of_a_problem(tmp_path):
    names = ["001_a.py", "001_b.py", "002_c.py"]
    for name in names:
        (tmp_path / name).write_text("def solution(x):\n    return x\n")
    files = {tmp_path / n: pairing.pair(tmp_path / n) for n in names}
    counts = batch._checks_of_each_problem(files, "pkb")
    assert counts == {str(P1.path): 2, str(problems.suite()[2].path): 1}


def _launches(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    seen: list[dict] = []
    real = run_module.run_launch

    def recorded(request, backend, cancel=None):
        start = time.monotonic()
        try:
            return real(request, backend, cancel)
        finally:  # killed with its check too
            candidate = request.solution_path != request.problem_path
            seen.append({**request.settings, "candidate": candidate, "start": start, "end": time.monotonic()})

    monkeypatch.setattr(run_module, "run_launch", recorded)
    return seen


def _check(path: Path) -> object:
    return service.check(_request(path))


@pytest.mark.integration
def test_checks_of_a_batch_take_references_made_ahead(isolated_dirs, monkeypatch, tmp_path):
    monkeypatch.setattr(ProcessBackend, "isolated", True)  # as Docker's; the process backend stands in
    monkeypatch.setenv("PKB_UNSEEN_SIZES", "1")
    launches = _launches(monkeypatch)
    good = tmp_path / "solution.py"
    shutil.copyfile(P1.path, good)
    with references.STOCK.expecting({str(P1.path): 3}):
        first = _check(good)
        assert first.verdict == "pass" and first.generalizes == "yes", first
        (reference,) = [s for s in launches if not s["candidate"]]
        groups = reference["later"]
        # its own unseen-size trial, then the next two checks' judged trials and unseen-size trials
        assert [len(g["seeds"]) for g in groups] == [1, 2, 1, 2, 1]
        assert groups[1]["size"] == groups[3]["size"] == P1.size("pkb")
        assert len({s for g in groups for s in g["seeds"]} | set(reference["seeds"])) == 9, "all fresh"
        launches.clear()
        wrong = _check(CANDIDATES / "wrong_scale.py")
        assert wrong.verdict == "fail" and wrong.generalizes is None, wrong
        third = _check(good)
        assert third.verdict == "pass" and third.generalizes == "yes", third
        assert all(s["candidate"] for s in launches), "no reference launched: both were made ahead"
        judged = [s for s in launches if s["size"] == P1.size("pkb")]
        assert [s["seeds"] for s in judged] == [groups[1]["seeds"], groups[3]["seeds"]]
        # each check's unseen-size trial, its candidate beside its judged trials (the failed one's ended
        # with its check), where and with what seed the first check's reference launch ran it
        drawn = [s for s in launches if s["size"] != P1.size("pkb")]
        assert [(s["size"], s["seeds"]) for s in drawn] == [(g["size"], g["seeds"]) for g in groups[2::2]]
        assert third.unseen.size == groups[4]["size"]
        shape = references.shape_of(run_module.Run(_request(good)), 2, True)
        assert references.STOCK.wanted(shape) == 0 and references.STOCK.take(shape) is None
    deadline = time.monotonic() + 10
    while list(isolated_dirs.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(isolated_dirs.iterdir()) == []


def _request(path: Path) -> RunRequest:
    return RunRequest(
        problem=1, path=path, world_size=2, device="cpu", trials=2, sandbox="process", unseen=True
    )


@pytest.mark.integration
def test_a_check_whose_reference_was_run_ahead_without_its_trial_launches_the_trial_s_own(
    isolated_dirs, monkeypatch, tmp_path
):
    """A reference run ahead with no unseen-size trial beside it (one drawn at another world size):
    the check's own trial launches its reference too, beside its candidate."""
    monkeypatch.setattr(ProcessBackend, "isolated", True)
    monkeypatch.setenv("PKB_UNSEEN_SIZES", "1")
    good = tmp_path / "solution.py"
    shutil.copyfile(P1.path, good)
    run = run_module.Run(_request(good))
    seeds = [11, 12]
    made = run.run_one(run.launch_request("outputs", P1.path, seeds), None)
    assert made.ok
    launches = _launches(monkeypatch)
    with references.STOCK.expecting({str(P1.path): 1}):
        references.STOCK.put(references.shape_of(run, 2, True), [Prepared(seeds, made)])
        r = _check(good)
    assert r.verdict == "pass" and r.generalizes == "yes", r
    judged = [s for s in launches if s["size"] == P1.size("pkb")]
    drawn = [s for s in launches if s["size"] != P1.size("pkb")]
    assert [(s["candidate"], s["seeds"]) for s in judged] == [(True, seeds)]
    assert sorted(s["candidate"] for s in drawn) == [False, True] and "later" not in drawn[0]
    assert max(s["start"] for s in drawn) < judged[0]["end"], "beside the judged trials, not after them"
