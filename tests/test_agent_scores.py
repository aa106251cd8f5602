"""The scores of an agent run (pkb_mcp/agents/scores.py; docs/measurement.md, "Agent runs"), fast: the
pass@k estimator against enumeration, each attempt's cause from the messages pkb really writes (copied
from `pkb eval --device cpu --world-size 2 --sandbox process` of tests/candidates/ and
tests/adversarial/ files against problem 1, 2026-12-02), no_tools counted apart, costs, the step
curve on hand-made records, the Markdown and the PNG."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from harness import structure
from pkb_mcp.agents import scores
from pkb_mcp.agents.records import AttemptRecord, Preflight, Snapshot, Usage
from pkb_mcp.agents.scores import cause, pass_at_k, score, step_curve
from pkb_mcp.evaluation.records import FileResult

# (outcome, message, correct, credited) as `pkb eval` gave them, and the cause each must be
OBSERVED = {
    "syntax_error.py": ("error", "the solution does not parse: 001_syntax.py:2: invalid syntax", "syntax"),
    "an unexpected indent": (
        "error", "the solution does not parse: 001_indent.py:3: unexpected indent", "syntax",
    ),
    "no_solution.py": (
        "error",
        "001_nosol.py defines no solution(): a candidate is a module whose solution(...) takes the "
        "reference's inputs (pkb show ID prints the signature)",
        "syntax",
    ),
    "an import that fails": (
        "error", "rank 0: raised ModuleNotFoundError: No module named 'not_a_module_at_all' during import",
        "runtime",
    ),
    "raises_on_rank1.py": ("error", "rank 1: raised RuntimeError: rank 1 gives up during trial 0", "runtime"),
    "segfaults.py": ("error", "rank 0: crashed (SIGSEGV)", "runtime"),
    "exits_early.py": ("error", "rank 1: exited with status 0 before finishing the launch", "runtime"),
    "hangs.py": (
        "timeout", "rank 0: still running at the deadline (deadlock or too slow); killed", "deadlock",
    ),
    "a broken C++ extension": (
        "build",
        "rank 0: failed to build extension 'pkb_probe_broken': 001_build.py:6:58: error: expected ‘;’ "
        "before ‘}’ token",
        "build",
    ),
    "wrong_scale.py": ("wrong", "rank 0, trial 0: relative error norm 0.00992 exceeds 0.005", "mismatch"),
    "out + 1": (
        "wrong",
        "rank 0, trial 0: 1048576 of 1048576 elements differ; first at index [0, 0]: expected 0.0410156, "
        "got 1.03906 (bounds atol 0.05, rtol 0.02)",
        "mismatch",
    ),
    "out[:1]": (
        "wrong", "rank 0, trial 0: output 0 is bfloat16[1, 1024], expected bfloat16[1024, 1024]", "shape",
    ),
    "out.half()": (
        "wrong", "rank 0, trial 0: output 0 is float16[1024, 1024], expected bfloat16[1024, 1024]", "shape",
    ),
    "out.double()": (
        "wrong",
        "rank 0, trial 0: unreadable output: t0_r0.pkbt holds 8388865 bytes, more than outputs of the "
        "expected shapes take (2097152 bytes of data and a header)",
        "shape",
    ),
    "return None": ("wrong", "rank 0, trial 0: the output: expected tensor, got None", "shape"),
    "returns_input.py": (
        "wrong", "rank 0, trial 0: output 0 shares memory with an input; return new tensors", "suspect",
    ),
    "mutates_input.py": (
        "wrong", "rank 0, trial 0: input 0 was changed by the solution; inputs are read-only", "suspect",
    ),
    "patches_perf_counter.py": (
        "error",
        "rank 0: raised SolutionError: the solution replaced time.perf_counter (during a call); patching "
        "clocks, torch, torch.distributed or the harness is not allowed during trial 0",
        "suspect",
    ),
    "cached_by_pointer.py": (
        "refused",
        "a timed call's output (call 0) differs from the judged output of the same inputs; results must "
        "be right on every call (between rounds the harness moves other data into the same input "
        "buffers: a result cached by buffer address goes stale)",
        "suspect",
    ),
    "lazy_on_new_inputs.py": (
        "wrong",
        "wrong on a fresh input set (a timed call on inputs never seen before; the trial number is the "
        "fresh call's): rank 0, trial 3: 1005819 of 1048576 elements differ; first at index [0, 0]: "
        "expected 1.05469, got 0 (bounds atol 0.05, rtol 0.02)",
        "suspect",
    ),
    # the messages tests/test_evaluate.py and tests/test_adversarial.py assert
    "a convention it cannot bridge": (
        "refused", "rank 0: raised ConventionError: problem 12 cannot run", "refused",
    ),
    "NVLink multicast": (
        "refused",
        "refused: multicast is unavailable: NVLink multicast (multimem / NVLS) is off on these hosts and "
        "the solution uses it (line 3: imports multimem)",
        "refused",
    ),
}  # fmt: skip
MEMOIZED = (
    "not credited: the candidate is 16.48x faster on input sets it has seen than on fresh ones (fresh "
    "calls: median 4.207 ms over 13, each 16.48x its replayed neighbours at the median, sign test p = "
    "0.00012): outputs memoized by input values? (measured 16.361x the reference; on fresh inputs it "
    "measured 0.588x)"
)  # memoized_by_values.py: pass, correct, not credited


def record(pid: int = 1, attempt: int = 0, status: str = "done", **extra) -> AttemptRecord:
    fields = {
        "problem_id": pid,
        "problem": f"problem{pid}",
        "attempt": attempt,
        "agent": "cmd",
        "agent_sandbox": "none",
        "status": status,
        "started_at": "2026-12-02T00:00:00Z",
        "finished_at": "2026-12-02T00:01:00Z",
        "wall_s": 60.0,
        "preflight": Preflight(ok=status != "no_tools", how="listed"),
        "solution": None if status in ("no_file", "agent_error") else "solution.py",
        **extra,
    }
    return AttemptRecord.model_validate(fields)


def result(
    outcome: str = "pass",
    message: str = "",
    *,
    pid: int = 1,
    attempt: int = 0,
    speedup: float | None = None,
    credited: bool = False,
    sha: str = "judged",
    **extra,
) -> FileResult:
    return FileResult(
        file=f"attempt-{attempt}/{pid:03d}.py",
        sha256=sha,
        problem_id=pid,
        outcome=outcome,  # type: ignore[arg-type]
        correct=outcome == "pass",
        message=message,
        speedup=speedup,
        credited=credited,
        attempt=attempt,
        **extra,
    )


# ---------------------------------------------------------------- pass@k


def brute_force(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c of them right) that hold a right one."""
    right = set(range(c))
    subsets = list(itertools.combinations(range(n), k))
    return sum(bool(right & set(s)) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_sample():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases_and_large_n():
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0  # k = n: any right one
    assert pass_at_k(7, 3, 1) == pytest.approx(3 / 7)  # k = 1: c / n
    assert pass_at_k(10, 2, 9) == 1.0  # n - c < k: every draw holds a right one
    # the product form stays exact where the binomials are huge
    assert pass_at_k(1000, 3, 500) == pytest.approx(1 - comb(997, 500) / comb(1000, 500), rel=1e-12)
    for n, c, k in ((3, 1, 4), (3, 1, 0), (0, 0, 1), (3, 4, 1), (3, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_default_ks_are_one_the_powers_of_two_below_and_the_attempts():
    assert scores.default_ks(1) == [1]
    assert scores.default_ks(5) == [1, 2, 4, 5]
    assert scores.default_ks(8) == [1, 2, 4, 8]
    assert scores.default_ks(10) == [1, 2, 4, 8, 10]


# ---------------------------------------------------------------- causes


@pytest.mark.parametrize("name", sorted(OBSERVED))
def test_each_failure_gets_its_cause_from_what_pkb_writes(name):
    outcome, message, expected = OBSERVED[name]
    assert cause(record(), result(outcome, message)) == expected


def test_a_structure_difference_is_shape_unless_a_value_of_the_same_kind_differs():
    # the judge's own words (harness/structure.py), behind the rank's prefix
    kinds = structure.difference(["tuple", [["tensor"], ["none"]]], ["tuple", [["tensor"], ["tensor"]]])
    count = structure.difference(["tuple", [["tensor"]]], ["tuple", [["tensor"], ["tensor"]]])
    value = structure.difference(["tuple", [["tensor"], ["int", 4]]], ["tuple", [["tensor"], ["int", 3]]])
    assert value == "output 1: expected int 3, got int 4"
    for said, expected in ((kinds, "shape"), (count, "shape"), (value, "mismatch")):
        assert said is not None
        assert cause(record(), result("wrong", f"rank 1, trial 2: {said}")) == expected
    # a result file whose header describes other outputs, in harness/tensorfile.py's words
    for header in ("the output holds 2 tensors, expected 1", "output 0 is float32[8], expected float32[4]"):
        assert cause(record(), result("wrong", f"rank 0, trial 0: {header}")) == "shape"


def test_correct_suspect_and_pkbs_protections():
    assert cause(record(), result("pass", "", speedup=1.4, credited=True)) == "correct"
    assert cause(record(), result("pass", "1.02x; no evidence of a difference")) == "correct"
    assert cause(record(), result("pass", MEMOIZED, speedup=16.4)) == "suspect"
    forged = "rank 0, trial 1: its output file was altered after the harness wrote it (a forged result file)"
    assert cause(record(), result("wrong", forged)) == "suspect"
    gone = "rank 1, trial 0: unreadable output: no output file"
    assert cause(record(), result("wrong", gone)) == "suspect"
    # the original variant: correct by the original's rules, failed by pkb's protections
    lead = "correct by the original benchmark's rules; fails pkb's: dtype"
    named = result("wrong", lead, protections=["dtype"])
    assert cause(record(), named) == "suspect"
    # a rank that crashed on a fresh input set crashed: runtime
    crashed = "wrong on a fresh input set (a timed call on inputs never seen before): rank 0: crashed"
    assert cause(record(), result("error", crashed)) == "runtime"


def test_the_attempts_own_status_comes_before_its_files_failure():
    wrong = result("wrong", OBSERVED["wrong_scale.py"][1])
    assert cause(record(status="no_tools"), result("pass")) == "no_tools"  # whatever it left
    assert cause(record(status="agent_timeout"), wrong) == "agent_timeout"
    assert cause(record(status="agent_timeout"), result("pass")) == "correct"  # a correct file is correct
    assert cause(record(status="agent_timeout"), None) == "agent_timeout"
    assert cause(record(status="agent_error"), None) == "agent_error"
    assert cause(record(status="no_file"), None) == "no_file"
    assert cause(record(), None) == "unjudged"
    assert cause(record(), result("env", "the job ended failed")) == "unjudged"
    assert cause(record(), result("skipped", "world size 3 is not allowed")) == "unjudged"


# ---------------------------------------------------------------- scores


def test_no_tools_is_counted_apart_and_a_problem_short_of_k_counts_by_its_best_of_n():
    records = [
        record(1, 0),
        record(1, 1),
        record(2, 0, status="no_file"),
        record(2, 1, status="no_tools"),
        record(3, 0, status="no_tools"),
        record(3, 1, status="no_tools"),
    ]
    results = {
        (1, 0): result("pass", pid=1, attempt=0, speedup=1.5, credited=True),
        (1, 1): result("wrong", OBSERVED["out + 1"][1], pid=1, attempt=1),
        (2, 1): result("pass", pid=2, attempt=1),  # the no_tools attempt's file counts nowhere
    }
    s = score(records, results, {1: "a", 2: "a", 3: "b"})
    by = {p.problem_id: p for p in s.problems}
    seen = [(by[p].attempts, by[p].counted, by[p].correct) for p in (1, 2, 3)]
    assert seen == [(2, 2, 1), (2, 1, 0), (2, 0, 0)]
    assert by[1].fast_1 == 1 and by[1].best_speedup == 1.5 and by[2].fast_1 == 0
    assert s.no_tools == 3 and s.causes == {"correct": 1, "mismatch": 1, "no_tools": 3, "no_file": 1}
    assert by[2].causes == {"no_tools": 1, "no_file": 1}
    # over problems 1 and 2 (3 has no counted attempt); at k = 2 problem 2 (n = 1) counts by its best of 1
    assert s.pass_at_k == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
    assert s.fast_1_at_k == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
    assert s.estimated == {"1": 2, "2": 1} and s.solved == 1
    assert score(records, results, {1: "a", 2: "a", 3: "b"}, ks=[4]).pass_at_k == {"4": pytest.approx(0.5)}


def test_fast_counts_a_credited_speedup_above_fast_p_only():
    records = [record(1, a) for a in range(3)]
    results = {
        (1, 0): result("pass", attempt=0, speedup=1.3, credited=True),
        (1, 1): result("pass", attempt=1, speedup=1.8, credited=False),  # within noise, or suspect
        (1, 2): result("pass", attempt=2, speedup=0.7, credited=True),
    }
    s = score(records, results, {1: "a"})
    assert (s.problems[0].correct, s.problems[0].fast_1, s.problems[0].best_speedup) == (3, 1, 1.3)
    assert s.fast_1_at_k["1"] == pytest.approx(1 / 3) and s.pass_at_k["3"] == 1.0
    assert score(records, results, {1: "a"}, fast_p=0.5).problems[0].fast_1 == 2


def test_costs_are_none_where_no_client_says_and_summed_where_some_do():
    records = [record(1, 0, wall_s=100.0), record(2, 0, wall_s=50.0)]
    results = {(1, 0): result("pass", pid=1), (2, 0): result("wrong", OBSERVED["out[:1]"][1], pid=2)}
    s = score(records, results, {1: "a", 2: "a"})
    assert s.cost_usd is None and s.cost_per_solved_usd is None and s.cost_attempts == 0
    assert s.problems[0].cost_usd is None
    assert s.wall_s == 150.0 and s.wall_per_solved_s == 150.0 and s.solved == 1
    records[1] = record(2, 0, wall_s=50.0, usage=Usage(cost_usd=0.75))
    s = score(records, results, {1: "a", 2: "a"})
    assert s.cost_usd == 0.75 and s.cost_attempts == 1 and s.cost_per_solved_usd == 0.75
    assert [p.cost_usd for p in s.problems] == [None, 0.75]
    none_solved = score(records, {}, {1: "a", 2: "a"})
    assert none_solved.solved == 0 and none_solved.cost_per_solved_usd is None
    assert none_solved.wall_per_solved_s is None and none_solved.causes == {"unjudged": 2}


# ---------------------------------------------------------------- correct against steps


def snap(
    step: int, passed: bool | None, speedup: float | None = None, sha: str = "loop", kind: str = "check"
) -> Snapshot:
    return Snapshot(
        index=0, kind=kind, at_s=float(step), step=step, sha256=sha, file="snapshots/x.py", passed=passed,
        speedup=speedup,
    )  # fmt: skip


def test_the_step_curve_is_the_mean_over_attempts_of_the_share_correct_by_step_s():
    records = [
        # attempt 0: problem 1 correct at step 3, fast at step 5; problem 2 never
        record(1, 0, snapshots=[snap(1, False), snap(3, True), snap(5, True, 1.4, kind="bench")]),
        record(2, 0, snapshots=[snap(2, False)], usage=Usage(tool_calls=8)),
        # attempt 1: problem 1 correct at step 2 (a benchmark that was not faster); problem 2 at step 6
        record(1, 1, snapshots=[snap(2, True, None, kind="bench")]),
        record(2, 1, snapshots=[snap(6, True)]),
        record(3, 1, status="no_tools", snapshots=[snap(1, True)], usage=Usage(tool_calls=30)),
    ]
    points = step_curve(records, {})
    assert [p.steps for p in points] == list(range(9))  # to the most tool calls a counted attempt made
    correct = {p.steps: p.correct for p in points}
    assert correct[0] == correct[1] == 0
    assert correct[2] == pytest.approx((0 + 0.5) / 2)
    assert correct[3] == pytest.approx((0.5 + 0.5) / 2)
    assert correct[6] == correct[8] == pytest.approx((0.5 + 1.0) / 2)
    fast = {p.steps: p.fast_1 for p in points}
    assert fast[4] == 0 and fast[5] == pytest.approx(0.25)
    assert [p.steps for p in step_curve(records, {}, max_steps=3)] == [0, 1, 2, 3]
    assert step_curve([records[-1]], {}) == []  # no attempt counts
    assert scores.reached(points, 0.5) == 3 and scores.reached(points, 1.0) == 6
    assert score(records, {}, {1: "a", 2: "a", 3: "a"}).steps == points


def test_a_snapshot_of_the_judged_bytes_takes_the_judgment():
    loop_passed = [snap(2, True, 1.5, sha="same", kind="bench")]
    judged_wrong = {(1, 0): result("wrong", OBSERVED["lazy_on_new_inputs.py"][1], sha="same")}
    points = step_curve([record(1, 0, snapshots=loop_passed)], judged_wrong)
    assert points[-1].correct == 0 and points[-1].fast_1 == 0
    loop_failed = [snap(4, False, sha="same")]  # e.g. the agent checked at another world size
    judged_fast = {(1, 0): result("pass", sha="same", speedup=1.2, credited=True)}
    points = step_curve([record(1, 0, snapshots=loop_failed)], judged_fast)
    assert (points[3].correct, points[4].correct, points[4].fast_1) == (0, 1, 1)
    other = {(1, 0): result("wrong", "x", sha="other")}  # other bytes: the loop's answer stands
    assert step_curve([record(1, 0, snapshots=loop_passed)], other)[-1].correct == 1


# ---------------------------------------------------------------- reports


def test_the_markdown_and_the_png(tmp_path):
    records = [
        record(1, 0, snapshots=[snap(3, True)], usage=Usage(tool_calls=25, cost_usd=1.5)),
        record(1, 1, snapshots=[snap(12, True)], usage=Usage(tool_calls=25, cost_usd=0.5)),
        record(2, 0, status="no_tools"),
        record(2, 1, status="agent_timeout", snapshots=[snap(20, False)]),
    ]
    results = {(1, 0): result("pass", attempt=0), (1, 1): result("pass", attempt=1)}
    s = score(records, results, {1: "collectives", 2: "collectives"})
    text = "\n".join(scores.to_markdown(s))
    assert "| 1 | 50.0% | 0.0% | 2 of 2 |" in text and "| 2 | 50.0% | 0.0% | 1 of 2 |" in text
    assert "| correct | 2 |" in text and "| no_tools | 1 |" in text and "| agent_timeout | 1 |" in text
    assert "cost $2.00 over the 2 of 4 attempt(s) that report one, $2.00 per problem solved" in text
    # attempt 0 counts problem 1 only (2 never had the tools), attempt 1 both: (1 + 1/2) / 2
    assert "| 10 | 50.0% | 0.0% |" in text and "| 25 | 75.0% | 0.0% |" in text
    assert "half its last value at 3 tool calls, 90% of it at 12 and all of it at 12" in text
    assert 'docs/measurement.md, "Agent runs"' in text
    png = tmp_path / "steps.png"
    assert scores.write_steps_png(s.steps, png) is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert scores.write_steps_png([], tmp_path / "none.png") is not None
