"""The unseen-size trial (pkb_mcp/runs/unseen.py): with each check, one trial at a size the
candidate was never shown, reported as `generalizes` apart from the verdict.

Fast: the draw's rules, and every problem's declared sizes drawn many times at world sizes 2 to 8 and
built on `meta`. Integration: every reference run at a drawn size in one process group per world size
(cheaper than a launch per problem), and the check itself through the harness: a solution tuned to
the shown shapes passes and does not generalize; the reference does; where launches are isolated,
the trial runs beside the judged ones and a failed check discards it."""

from __future__ import annotations

import datetime
import random
import secrets
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from harness.context import ProblemContext
from pkb_mcp import problems, service
from pkb_mcp.launches import LaunchOutcome
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import references, unseen
from pkb_mcp.runs import run as run_module
from pkb_mcp.runs.run import Run
from pkb_mcp.runs.unseen import Draw
from sandbox.process import ProcessBackend

from .conftest import CANDIDATES, ROOT

SUITE = problems.suite()
DECLARED = sorted(pid for pid, p in SUITE.items() if unseen.declares(p))
WORLD_SIZES = [2, 3, 4, 8]


# ---------------------------------------------------------------- the draw


def test_a_draw_is_in_range_a_multiple_and_never_a_preset_s_value():
    draw = Draw([{"rows": 1024}, {"rows": 64}], random.Random(1))
    values = {draw("rows", 64, 1024, 64) for _ in range(400)}
    assert values == set(range(128, 1024, 64))  # 64 and 1024 are the presets'
    assert all(draw("cols", 5, 7) in (5, 6, 7) for _ in range(50))  # a key no preset has
    assert draw("cols", 60, 70, 8) == 64  # the one multiple of 8 in range


def test_a_draw_with_no_value_left_says_which_key():
    draw = Draw([{"heads": 8}], random.Random(2))
    with pytest.raises(ValueError, match="every value of 'heads'"):
        draw("heads", 8, 8)
    with pytest.raises(ValueError, match="no range for 'heads'"):
        draw("heads", 9, 8)


# ---------------------------------------------------------------- every problem's declared sizes


def test_every_problem_of_the_pkb_variant_declares_unseen_sizes():
    missing = sorted(pid for pid in SUITE if pid not in DECLARED)
    assert missing == [], f"problems without unseen_size(draw, world_size): {missing}"


def test_the_original_variant_has_none():
    assert not any(unseen.declares(p) for p in problems.suite("original").values())


@pytest.mark.parametrize("pid", DECLARED)
def test_drawn_sizes_suit_the_problem_and_build_its_inputs(pid):
    """At every world size the problem allows, 8 draws: a size no preset is, accepted by the problem's
    rules, whose inputs build on `meta` with a shape that differs from the presets' somewhere."""
    p = SUITE[pid]
    rng = random.Random(pid)
    for w in WORLD_SIZES:
        for _ in range(8):
            size = unseen.draw_size(p, w, "pkb", rng)
            if size is None and p.world_size_error(w, "pkb"):
                break  # a world size the problem refuses (drawn sizes may allow one its presets refuse)
            assert size is not None, f"problem {pid}: no drawn size suits world size {w}"
            assert unseen.shown_size(p, size) != "a new combination of the presets' values"
            shapes = _shapes(p, w, size)
            assert shapes, f"problem {pid}: no inputs at {size}"
            assert shapes != _shapes(p, w, p.size("pkb")), f"problem {pid}: {size} gives the preset's inputs"


def _shapes(p: problems.Problem, world_size: int, size: dict) -> list:
    ctx = ProblemContext(0, world_size, size, p.torch_dtype, torch.device("meta"))
    inputs = p.module.make_inputs(ctx)
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    return [tuple(x.shape) if isinstance(x, torch.Tensor) else repr(x) for x in inputs]


def test_the_trial_moves_to_a_smaller_world_size_the_problem_allows():
    p = SUITE[1]
    placed = unseen.placement(p, 4, "pkb", random.Random(3))
    assert placed is not None and placed[0] == 3
    assert unseen.placement(p, 2, "pkb", random.Random(3))[0] == 2  # type: ignore[index]


# ---------------------------------------------------------------- every reference at a drawn size


def _run_every_reference(rank: int, world_size: int, store: str, seed: int, report: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    failed: list[str] = []
    for pid in DECLARED:
        p = SUITE[pid]
        size = unseen.draw_size(p, world_size, "pkb", random.Random(seed + pid))  # the same on every rank
        if size is None and p.world_size_error(world_size, "pkb"):
            continue  # no size of the problem suits this world size
        try:
            assert size is not None, "no size drawn"
            ctx = ProblemContext(rank, world_size, size, p.torch_dtype, torch.device("cpu"), seed=seed + pid)
            inputs = p.module.make_inputs(ctx)
            p.module.solution(*(inputs if isinstance(inputs, (tuple, list)) else (inputs,)))
        except Exception:
            failed.append(f"problem {pid} at {size}:\n{traceback.format_exc(limit=4)}")
            break  # a rank that raised leaves the others in a collective: the group is spent
        dist.barrier()
    if failed:
        Path(f"{report}.{rank}").write_text("\n".join(failed))
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_reference_runs_at_a_drawn_size(world_size, tmp_path):
    report = tmp_path / "failed"
    torch.multiprocessing.spawn(
        _run_every_reference,
        args=(world_size, str(tmp_path / "store"), random.randrange(1 << 30), str(report)),
        nprocs=world_size,
    )
    failures = [f.read_text() for f in sorted(tmp_path.glob("failed.*"))]
    assert failures == [], "\n".join(failures)


# ---------------------------------------------------------------- the check


def check(path: Path, world_size: int = 2, **more) -> object:
    return service.check(
        RunRequest(
            problem=1,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=1,
            sandbox="process",
            **more,
        )
    )


@pytest.mark.integration
def test_a_solution_tuned_to_the_shown_shapes_passes_and_does_not_generalize(isolated_dirs):
    r = check(CANDIDATES / "shape_tuned.py", world_size=4, unseen=True)
    assert r.verdict == "pass", r.message
    assert r.generalizes == "no" and r.unseen is not None, r
    assert r.unseen.world_size == 3 and r.unseen.size != SUITE[1].size("pkb")
    assert r.unseen.message.startswith("at world size 3, size rows=") and "differ" in r.unseen.message
    assert ": rank 0, trial 0: " in r.unseen.message  # rank 0 is wrong first (they all are)
    assert list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
def test_the_reference_generalizes_and_the_trial_can_be_turned_off(isolated_dirs):
    r = check(SUITE[1].path, unseen=True)
    assert r.verdict == "pass" and r.generalizes == "yes", r
    assert r.unseen is not None and r.unseen.message.startswith("matches the reference at world size 2")
    off = check(SUITE[1].path, unseen=False)
    assert off.verdict == "pass" and off.generalizes is None and off.unseen is None


@pytest.mark.integration
def test_a_failed_check_runs_no_unseen_trial(isolated_dirs):
    r = check(CANDIDATES / "wrong_scale.py", unseen=True)
    assert r.verdict == "fail" and r.generalizes is None and r.unseen is None


# ---------------------------------------------------------------- beside the judged trials


def _timed_launches(monkeypatch: pytest.MonkeyPatch, fail_later: bool = False) -> list[Span]:
    """Each launch's settings, whether it ran the candidate, its start and end and whether it passed,
    as the check's launches run; with `fail_later` a reference launch that carries the unseen
    trial's part fails (as if its ranks had)."""
    spans: list[Span] = []
    real = run_module.run_launch

    def timed(request, backend, cancel=None):
        start = time.monotonic()
        outcome = None
        try:
            outcome = real(request, backend, cancel)
            if fail_later and "later" in request.settings:
                outcome.ranks[0] = replace(outcome.ranks[0], state="error", error="RuntimeError: as if")
            return outcome
        finally:
            candidate = request.solution_path != request.problem_path
            ok = outcome is not None and outcome.ok
            spans.append(Span(request.settings, candidate, start, time.monotonic(), ok))

    monkeypatch.setattr(run_module, "run_launch", timed)
    return spans


def copy_of_reference(tmp_path: Path) -> Path:
    """Problem 1's reference as a candidate file (a launch of it counts as the candidate's)."""
    path = tmp_path / "solution.py"
    shutil.copyfile(SUITE[1].path, path)
    return path


@dataclass
class Span:
    settings: dict
    candidate: bool
    start: float
    end: float
    ok: bool


def test_the_trial_runs_beside_the_judged_ones_in_isolated_small_runs(monkeypatch):
    def trial(size: str, isolated: bool, path: Path = CANDIDATES / "original_helper_cuda.py") -> unseen.Trial:
        monkeypatch.setattr(ProcessBackend, "isolated", isolated)  # the class: backends are shared
        request = RunRequest(problem=1, path=path, world_size=2, device="cpu", size=size, sandbox="process")
        return unseen.Trial(Run(request))

    assert trial("pkb", isolated=True).side_by_side  # an extension to load in every launch
    assert trial("pkb", True, ROOT / "examples" / "001_allreduce_cuda_oneshot.py").side_by_side
    assert trial("pkb", True, SUITE[1].path).side_by_side  # plain
    assert not trial("pkb", isolated=False).side_by_side  # the candidate could read the reference's files
    assert not trial("large", isolated=True).side_by_side  # four launches' memory at once
    monkeypatch.setenv("PKB_UNSEEN_BESIDE", "0")
    assert not trial("pkb", isolated=True).side_by_side
    monkeypatch.setenv("PKB_UNSEEN_BESIDE", "yes")
    with pytest.raises(ValueError, match="PKB_UNSEEN_BESIDE"):
        trial("pkb", isolated=True).side_by_side  # noqa: B018


@pytest.mark.integration
def test_where_launches_are_isolated_the_trial_starts_with_the_judged_ones(
    isolated_dirs, monkeypatch, tmp_path
):
    """Beside them at the run's world size, the trial's reference part runs in the judged trials'
    reference launch, after its trials: three launches, not four."""
    monkeypatch.setattr(ProcessBackend, "isolated", True)  # as Docker's; the process backend stands in
    spans = _timed_launches(monkeypatch)
    r = check(copy_of_reference(tmp_path), unseen=True)
    assert r.verdict == "pass" and r.generalizes == "yes", r
    assert r.unseen is not None and r.unseen.world_size == 2
    shown = SUITE[1].size("pkb")
    judged = [s for s in spans if s.settings["size"] == shown]
    drawn = [s for s in spans if s.settings["size"] != shown]
    assert len(judged) == 2 and len(drawn) == 1 and drawn[0].candidate, spans
    reference = next(s for s in judged if not s.candidate)
    (group,) = reference.settings["later"]
    assert group["size"] == drawn[0].settings["size"] == r.unseen.size
    assert group["seeds"] == drawn[0].settings["seeds"] != reference.settings["seeds"]
    assert drawn[0].start < min(s.end for s in judged)
    assert list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
def test_a_failed_check_discards_the_trial_started_beside_it(isolated_dirs, monkeypatch):
    monkeypatch.setattr(ProcessBackend, "isolated", True)
    spans = _timed_launches(monkeypatch)
    r = check(CANDIDATES / "wrong_scale.py", unseen=True)
    assert r.verdict == "fail" and r.generalizes is None and r.unseen is None
    assert len(spans) == 3  # the drawn candidate ran (or was killed) and ended with the check
    assert not [t.name for t in threading.enumerate() if t.name.startswith("unseen")]
    assert list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
def test_a_failed_shared_reference_launch_is_told_apart_by_launches_of_their_own(
    isolated_dirs, monkeypatch, tmp_path
):
    """Where the reference launch that also ran the trial's part fails, the judged trials' reference
    runs again alone (it passes: the check goes on), and so does the trial's (as before the parts
    shared a launch)."""
    monkeypatch.setattr(ProcessBackend, "isolated", True)
    spans = _timed_launches(monkeypatch, fail_later=True)
    r = check(copy_of_reference(tmp_path), unseen=True)
    assert r.verdict == "pass" and r.generalizes == "yes", r
    references = [s for s in spans if not s.candidate]
    assert [("later" in s.settings, s.ok) for s in references] == [
        (True, False),
        (False, True),
        (False, True),
    ]
    assert references[2].settings["size"] == r.unseen.size != references[1].settings["size"]


@pytest.mark.integration
def test_later_trials_give_a_launch_of_their_own_s_outputs_and_only_to_the_reference(isolated_dirs):
    """The trial's part of a reference launch is what a launch of its own at that size gives, keyed by
    its own seeds; a candidate's launch that asks for later trials fails without running any."""
    p = SUITE[1]
    run = Run(RunRequest(problem=1, path=p.path, world_size=2, device="cpu", sandbox="process"))
    seeds, later_seeds = [secrets.randbits(62) for _ in range(2)], [secrets.randbits(62)]
    size = {**p.size("pkb"), "rows": p.size("pkb")["rows"] + 8}
    both = run.run_one(
        run.launch_request("outputs", p.path, seeds, later=[{"size": size, "seeds": later_seeds}]), None
    )
    alone = run.run_one(run.launch_request("outputs", p.path, later_seeds, size=size), None)
    assert both.ok and alone.ok
    first, later = references.split_outcome(both, [len(seeds), len(later_seeds)])
    assert sorted(first.outputs) == [(t, r) for t in range(2) for r in range(2)]
    assert sorted(later.outputs) == sorted(alone.outputs) == [(0, 0), (0, 1)]
    for k in alone.outputs:
        assert later.outputs[k].meta == alone.outputs[k].meta
        for x, y in zip(later.outputs[k].tensors, alone.outputs[k].tensors, strict=True):
            assert x.equal(y)
    request = run.launch_request("outputs", CANDIDATES / "wrong_scale.py", seeds)
    request.settings["later"] = [{"size": size, "seeds": later_seeds}]  # past launch_request's assertion
    refused = run.run_one(request, None)
    assert not refused.ok and not refused.outputs
    assert "only the problem's reference runs later trials" in refused.ranks[0].error
    assert list(isolated_dirs.iterdir()) == []


def test_an_outcome_splits_into_its_first_trials_and_the_later_ones():
    outcome = LaunchOutcome(ranks=[], wall_s=1.0, timed_out=False)
    outcome.outputs = {(t, r): f"out{t}{r}" for t in range(3) for r in range(2)}  # type: ignore[misc]
    outcome.output_errors = {(3, 1): "unreadable"}
    first, later, last = references.split_outcome(outcome, [2, 1, 1])
    assert first.outputs == {(t, r): f"out{t}{r}" for t in range(2) for r in range(2)}
    assert later.outputs == {(0, 0): "out20", (0, 1): "out21"} and later.output_errors == {}
    assert last.outputs == {} and last.output_errors == {(0, 1): "unreadable"}
    assert first.output_errors == {} and first.wall_s == later.wall_s == 1.0


def test_a_trial_candidate_s_expectation_waits_for_its_reference_part_and_never_past_its_end(monkeypatch):
    """Beside the judged trials, the unseen trial's candidate launch learns its expected outputs from
    its part of the judged trials' reference launch (issue 49: header first, bytes capped): given, it
    is that part; lost (that launch failed) or the trial discarded, it is none at once, never a wait."""
    monkeypatch.setattr(ProcessBackend, "isolated", True)
    request = RunRequest(problem=1, path=SUITE[1].path, world_size=2, device="cpu", sandbox="process")
    given = unseen.Trial(Run(request))
    outcome = object()
    threading.Timer(0.2, given.take_reference, args=(outcome,)).start()
    assert given._given_reference() is outcome
    for end in ("reference_lost", "discard"):
        trial = unseen.Trial(Run(request))
        getattr(trial, end)()
        t0 = time.monotonic()
        with pytest.raises(LookupError):
            trial._given_reference()
        assert time.monotonic() - t0 < 1
