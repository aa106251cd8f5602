"""The published table of `pkb eval` (pkb_mcp/evaluation/table.py), from hand-built results: correct and
fast_1 per category and overall, over the whole suite (a problem with no file is not correct), best of
k over attempts, variants grouped apart, and the Markdown rows; and attempts read from the paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkb_mcp import problems
from pkb_mcp.errors import UserError
from pkb_mcp.evaluation import report as eval_report
from pkb_mcp.evaluation import table
from pkb_mcp.evaluation.batch import collect_attempts
from pkb_mcp.evaluation.records import EvalReport, EvalSettings, FileResult

# a suite of five problems in three categories
SUITE = {1: "primitive", 2: "primitive", 3: "TP", 4: "TP", 5: "EP"}


def _file(
    pid: int | None,
    outcome: str,
    speedup: float | None = None,
    *,
    credited: bool = True,
    attempt: int = 0,
    variant: str = "pkb",
) -> FileResult:
    return FileResult(
        variant=variant,
        file=f"attempt{attempt}/{pid}_x_cuda.py",
        sha256="0",
        problem_id=pid,
        outcome=outcome,  # type: ignore[arg-type]
        correct=outcome == "pass",
        speedup=speedup,
        credited=credited and speedup is not None,
        attempt=attempt,
    )


ONE_ATTEMPT = [
    _file(1, "pass", 2.0),  # correct and faster
    _file(2, "pass", 0.8),  # correct, slower
    _file(3, "wrong"),
    _file(4, "pass", 3.0, credited=False),  # correct, its speedup not credited: not fast
    # problem 5 has no file
]


def _rows(t) -> dict[tuple[str, str], object]:
    return {(r.variant, r.category): r for r in t.rows}


def test_correct_and_fast_1_per_category_and_overall_are_of_the_whole_suite():
    t = table.published_table(ONE_ATTEMPT, SUITE)
    assert t.attempts == 1 and t.variants == ["pkb"]
    assert [r.category for r in t.rows] == ["primitive", "TP", "EP", "all"]
    got = {
        r.category: (r.problems, r.with_files, r.correct, r.fast_1, r.best_correct, r.best_fast_1)
        for r in t.rows
    }
    assert got == {
        "primitive": (2, 2, 2, 1, 2, 1),
        "TP": (2, 2, 1, 0, 1, 0),
        "EP": (1, 0, 0, 0, 0, 0),  # no file: in the denominator, not correct
        "all": (5, 4, 3, 1, 3, 1),
    }


def test_a_problem_correct_only_in_attempt_2_counts_once_in_best_of_k():
    results = [
        _file(1, "wrong", attempt=0),
        _file(1, "pass", 1.5, attempt=1),
        _file(2, "pass", 0.9, attempt=0),
        _file(2, "pass", 0.9, attempt=1),
        _file(3, "pass", 2.0, attempt=0),
        _file(3, "error", attempt=1),
    ]
    t = table.published_table(results, SUITE, attempts=2)
    overall = _rows(t)[("pkb", "all")]
    assert overall.best_correct == 3 and overall.best_fast_1 == 2
    assert overall.correct == pytest.approx((2 + 2) / 2)  # per attempt, the mean of the two
    assert overall.fast_1 == pytest.approx((1 + 1) / 2)
    primitive = _rows(t)[("pkb", "primitive")]
    assert (primitive.best_correct, primitive.correct) == (2, pytest.approx(1.5))
    # k is the attempts asked for, even where the last produced no file
    assert table.published_table(results, SUITE, attempts=4).rows[-1].correct == pytest.approx(1.0)
    assert table.published_table(results, SUITE).attempts == 2
    thirds = table.published_table(results, SUITE, attempts=3)
    assert table.to_markdown(thirds)[-1].startswith("| **all** | 5 | 3 | 0 | 1.33 (26.7%) | 0.67 (13.3%) |")


def test_a_problem_whose_files_reached_no_verdict_is_not_judged_and_not_correct():
    results = [_file(1, "env"), _file(3, "skipped"), _file(3, "wrong"), _file(99, "pass", 2.0)]
    t = table.published_table(results, SUITE)
    overall = _rows(t)[("pkb", "all")]
    assert (overall.problems, overall.with_files, overall.unjudged, overall.correct) == (5, 2, 1, 0)
    assert _rows(t)[("pkb", "primitive")].unjudged == 1 and _rows(t)[("pkb", "TP")].unjudged == 0
    # problem 99 is no problem of the suite: left out, so it counts nowhere
    assert t.repeated == ["problem 3: 2 files in attempt 1"]


def test_several_files_of_a_problem_in_one_attempt_count_once_by_the_best():
    results = [_file(1, "wrong"), _file(1, "pass", 1.2), _file(1, "pass", 0.5)]
    overall = table.published_table(results, SUITE).rows[-1]
    assert (overall.correct, overall.fast_1, overall.best_correct) == (1, 1, 1)


def test_without_a_benchmark_fast_1_is_unknown():
    t = table.published_table([_file(1, "pass")], SUITE, benched=False)
    assert all(r.fast_1 is None and r.best_fast_1 is None for r in t.rows)
    assert t.rows[-1].correct == 1
    assert table.to_markdown(t)[-1] == "| **all** | 5 | 1 | 0 | 1 (20.0%) |  |"


def test_variants_are_grouped_apart_pkb_first():
    results = [_file(1, "pass", 2.0, attempt=1, variant="original"), _file(3, "pass", 0.5, attempt=0)]
    t = table.published_table(results, SUITE, attempts=2)
    assert t.variants == ["pkb", "original"]
    assert [(r.variant, r.category) for r in t.rows][:4] == [
        ("pkb", "primitive"),
        ("pkb", "TP"),
        ("pkb", "EP"),
        ("pkb", "all"),
    ]
    assert _rows(t)[("original", "all")].best_fast_1 == 1 and _rows(t)[("pkb", "all")].best_correct == 1
    assert _rows(t)[("pkb", "all")].best_fast_1 == 0
    assert table.to_markdown(t)[2].startswith("| variant | category |")


def test_the_original_variant_counts_correct_by_the_original_s_rules_too():
    """The difference the protections make: an original-variant file failed only by pkb's protections
    is not correct, and is correct by the original's rules; a correct file is both; the pkb variant
    has no such figure."""
    protected = _file(1, "wrong", variant="original").model_copy(
        update={"original_correct": True, "protections": ["aliasing"]}
    )
    wrong = _file(3, "wrong", variant="original").model_copy(update={"original_correct": False})
    results = [protected, wrong, _file(2, "pass", 1.2, variant="original"), _file(4, "pass", 2.0)]
    t = table.published_table(results, SUITE)
    original, pkb = _rows(t)[("original", "all")], _rows(t)[("pkb", "all")]
    assert (original.correct, original.original_correct, original.best_original_correct) == (1, 2, 2)
    assert _rows(t)[("original", "primitive")].original_correct == 2
    assert pkb.correct == 1 and pkb.original_correct is None and pkb.best_original_correct is None
    lines = table.to_markdown(t)
    assert "correct by the original's rules" in lines[0]
    assert lines[2].endswith("| correct | fast_1 | correct by the original's rules |")
    assert "| pkb | **all** | 5 | 1 | 0 | 1 (20.0%) | 1 (20.0%) |  |" in lines
    assert "| original | **all** | 5 | 3 | 0 | 1 (20.0%) | 1 (20.0%) | 2 (40.0%) |" in lines


def test_the_markdown_rows_of_one_attempt_and_of_k():
    lines = table.to_markdown(table.published_table(ONE_ATTEMPT, SUITE))
    assert lines[2:] == [
        "| category | problems | with a file | not judged | correct | fast_1 |",
        "| --- | --- | --- | --- | --- | --- |",
        "| primitive | 2 | 2 | 0 | 2 (100.0%) | 1 (50.0%) |",
        "| TP | 2 | 2 | 0 | 1 (50.0%) | 0 (0.0%) |",
        "| EP | 1 | 0 | 0 | 0 (0.0%) | 0 (0.0%) |",
        "| **all** | 5 | 4 | 0 | 3 (60.0%) | 1 (20.0%) |",
    ]
    two = [*ONE_ATTEMPT, _file(3, "pass", 1.1, attempt=1)]
    lines = table.to_markdown(table.published_table(two, SUITE, attempts=2))
    assert lines[2] == (
        "| category | problems | with a file | not judged | correct (mean of k) | fast_1 (mean of k) "
        "| correct, best of 2 | fast_1, best of 2 |"
    )
    assert lines[5] == "| TP | 2 | 2 | 0 | 1 (50.0%) | 0.5 (25.0%) | 2 (100.0%) | 1 (50.0%) |"
    assert lines[-1] == "| **all** | 5 | 4 | 0 | 2 (40.0%) | 1 (20.0%) | 4 (80.0%) | 2 (40.0%) |"


def test_the_report_carries_the_table_in_json_and_markdown(tmp_path):
    results = [_file(1, "pass", 2.0, attempt=0), _file(1, "wrong", attempt=1)]
    report = EvalReport(
        settings=EvalSettings(world_size=2),
        store="/tmp/x.sqlite",
        wall_s=1.0,
        resumed=0,
        results=results,
        summary=eval_report.summarize(results),
        table=table.published_table(results, SUITE, attempts=2),
    )
    md = eval_report.to_markdown(report)
    assert "| attempt | file | problem |" in md and "| 2 | 1_x_cuda.py | 1 |" in md
    assert "| **all** | 5 | 1 | 0 | 0.5 (10.0%) | 0.5 (10.0%) | 1 (20.0%) | 1 (20.0%) |" in md
    paths, _ = eval_report.write_reports(report, tmp_path)
    loaded = EvalReport.model_validate_json(Path(paths["json"]).read_text())
    assert loaded.table == report.table
    rows = Path(paths["csv"]).read_text().splitlines()
    assert rows[0].endswith(",message,attempt") and rows[2].endswith(",1")


def test_the_categories_are_every_problem_s_own():
    categories = table.suite_categories()
    assert categories == {pid: p.category for pid, p in problems.suite().items()}
    assert categories[1] == "primitive" and categories[13] == "TP"


def test_each_path_is_one_attempt_and_a_file_belongs_to_one(tmp_path):
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "1_allreduce_cuda.py").write_text("")
    (tmp_path / "run2" / "13_gemm_allreduce_cuda.py").write_text("")
    got = collect_attempts([tmp_path / "run1", tmp_path / "run2"], attempts=True)
    assert {(p.parent.name, p.name): a for p, a in got.items()} == {
        ("run1", "1_allreduce_cuda.py"): 0,
        ("run2", "13_gemm_allreduce_cuda.py"): 1,
        ("run2", "1_allreduce_cuda.py"): 1,
    }
    assert set(collect_attempts([tmp_path / "run1", tmp_path / "run2"], attempts=False).values()) == {0}
    with pytest.raises(UserError, match="attempt 1 and attempt 2"):
        collect_attempts([tmp_path / "run1", tmp_path / "run1" / "1_allreduce_cuda.py"], attempts=True)


def test_problems_passable_without_an_exchange_are_marked_and_a_row_leaves_them_out():
    """The original variant's problems whose workload a solution that communicates nothing passes:
    counted in "all", left out of "all that must communicate", listed with their reasons, marked in
    the report's rows."""
    results = [_file(1, "pass", 2.0, variant="original"), _file(3, "pass", 0.5, variant="original")]
    passable = {"original": {1: "its answer is a known constant"}}
    t = table.published_table(results, SUITE, without_exchange=passable)
    rows = _rows(t)
    assert (rows[("original", "all")].problems, rows[("original", "all")].correct) == (5, 2)
    rest = rows[("original", table.ALL_THAT_COMMUNICATE)]
    assert (rest.problems, rest.correct, rest.fast_1) == (4, 1, 0)
    assert t.without_exchange == passable
    md = "\n".join(table.to_markdown(t))
    assert "| **all that must communicate** | 4 |" in md and "- 1: its answer is a known constant" in md
    report = EvalReport(
        settings=EvalSettings(world_size=2), store="/tmp/x.sqlite", wall_s=1.0, resumed=0, results=results,
        summary=eval_report.summarize(results), table=t,
    )  # fmt: skip
    assert "| 1_x_cuda.py | 1 (passes without communicating) |" in eval_report.to_markdown(report)


def test_the_suite_s_passable_problems_are_the_original_variant_s_by_world_size():
    found = table.passable_without_exchange(["pkb", "original"], 2)
    assert "pkb" not in found  # the pkb variant's inputs are random: every workload must communicate
    assert {1, 8, 64, 80} <= set(found["original"]) and 51 in found["original"]
    assert 51 not in table.passable_without_exchange(["original"], 4)["original"]  # groups of 2 at W = 4
    assert 12 not in found["original"]  # an all-gather GEMM must gather


@pytest.mark.parametrize("value", ["", 3, {1: "x"}, {2: ""}, ["x"]])
def test_a_malformed_passes_without_exchange_is_refused_naming_the_file(tmp_path, monkeypatch, value):
    src = problems.suite("original")[1].path.read_text()
    bad = tmp_path / "001_allreduce.py"
    bad.write_text(src + f"\nPASSES_WITHOUT_EXCHANGE = {value!r}\n")  # the last assignment wins
    with pytest.raises(problems.ProblemFormatError, match="PASSES_WITHOUT_EXCHANGE"):
        problems.load_problem(bad, variant="original")
