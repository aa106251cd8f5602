"""`pkb eval` (pkb_mcp/evaluation/): files found by name, outcomes classified,
scores as docs/measurement.md defines them, every report format, and the example directory
(examples/original) end to end on CPU: right verdicts, a resume that reruns nothing, an interrupted
run that resumes, and errors of the environment kept apart from the candidates' failures."""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkb_mcp.errors import UserError
from pkb_mcp.evaluation import report as eval_report
from pkb_mcp.evaluation.batch import _from_check, classify, collect_files, evaluate, pair_files
from pkb_mcp.evaluation.records import EvalReport, EvalSettings, FileResult
from pkb_mcp.models import CheckResult, RankResult, SandboxInfo
from pkb_mcp.runs import run

from .conftest import ROOT

EXAMPLES = ROOT / "examples" / "original"
EXPECTED = {
    "001_allreduce_torch.py": "pass",
    "007_reducescatter_torch.py": "wrong",
    "008_alltoall_torch.py": "timeout",
    "013_gemm_allreduce_cpp.py": "build",
    "018_tp_rms_norm_torch.py": "pass",
    "021_clip_grad_norm_no_ep_torch.py": "pass",
}


# ---------------------------------------------------------------- files and outcomes (no sandbox)


def test_files_come_from_directories_globs_and_paths_each_once(tmp_path):
    for name in ("001_a_torch.py", "002_b.py", "_private.py", "notes.txt"):
        (tmp_path / name).write_text("")
    found = collect_files([tmp_path, str(tmp_path / "00*.py"), tmp_path / "002_b.py"])
    assert [p.name for p in found] == ["001_a_torch.py", "002_b.py"]
    (tmp_path / "model_a").mkdir()
    (tmp_path / "model_a" / "003_c_cuda.py").write_text("")
    assert [p.name for p in collect_files([str(tmp_path / "**" / "003_*.py")])] == ["003_c_cuda.py"]
    with pytest.raises(UserError, match="not a file, a directory or a glob"):
        collect_files([tmp_path / "missing*.py"])


def test_the_problem_and_backend_come_from_the_name():
    names = ["019_blocked_fp8_quantize_triton.py", "1_allreduce_cuda.py", "001_allreduce.py", "allreduce.py"]
    paired = pair_files([Path(n) for n in names])
    found = [(p.problem.id if p.problem else None, p.backend) for p in paired.values()]
    assert found == [(19, "triton"), (1, "cuda"), (1, None), (None, None)]


def _check(verdict: str, message: str, states: list[str], notes: list[str] | None = None) -> CheckResult:
    return CheckResult(
        problem_id=1,
        problem="allreduce",
        world_size=len(states),
        size="pkb",
        device="cpu",
        trials=1,
        verdict=verdict,  # type: ignore[arg-type]
        message=message,
        ranks=[RankResult(rank=i, state=s, message=message) for i, s in enumerate(states)],  # type: ignore[arg-type]
        wall_s=1.0,
        sandbox=SandboxInfo(backend="process", isolated=False),
        notes=notes or [],
    )


def test_a_file_failed_only_by_pkb_s_protections_is_correct_by_the_original_s_rules():
    """The original variant's files carry `original_correct` and the protections named (the published
    table's difference); the pkb variant's carry neither."""
    base = FileResult(
        file="5_scatter_cuda.py", sha256="0", problem_id=5, variant="original", outcome="skipped"
    )
    named = _check("fail", "correct by the original benchmark's rules; ...", ["pass", "wrong"])
    named.protections = ["aliasing", "mutation"]
    r = _from_check(base, named, "job")
    assert (r.outcome, r.correct, r.original_correct, r.protections) == (
        "wrong",
        False,
        True,
        ["aliasing", "mutation"],
    )
    wrong = _from_check(base, _check("fail", "rank 1: 3 elements differ", ["pass", "wrong"]), "job")
    assert (wrong.original_correct, wrong.protections) == (False, [])
    passed = _from_check(base, _check("pass", "ok", ["pass", "pass"]), "job")
    assert passed.original_correct is True
    pkb = _from_check(base.model_copy(update={"variant": "pkb"}), named, "job")
    assert pkb.original_correct is None and pkb.protections == []


def test_outcomes_are_classified_from_the_result():
    assert classify(_check("pass", "ok", ["pass", "pass"])) == "pass"
    assert classify(_check("fail", "rank 0: 3 elements differ", ["wrong", "aborted"])) == "wrong"
    assert classify(_check("timeout", "deadline", ["timeout", "timeout"])) == "timeout"
    assert classify(_check("fail", "raised ValueError", ["error", "wrong"])) == "error"
    built = _check("fail", "failed to build extension 'x': cuda.cu:127: error: no", ["error", "aborted"])
    assert classify(built) == "build"
    # a build that failed but was never loaded is no cause: the candidate raised first
    raised = _check(
        "fail",
        "rank 0, trial 0: raised TypeError: solution() takes 2",
        ["error", "aborted"],
        notes=["extension x failed to build: cuda.cu:127: error: no"],
    )
    assert classify(raised) == "error"
    refused = _check("fail", "rank 0: raised ConventionError: problem 12 cannot run", ["error", "error"])
    assert classify(refused) == "refused"
    multicast = _check("fail", "uses NVLink multicast", ["error", "error"])
    for r in multicast.ranks:
        r.message = "not run: uses NVLink multicast"
    assert classify(multicast) == "refused"


def _result(outcome: str, speedup: float | None = None, credited: bool = True, **extra) -> FileResult:
    return FileResult(
        file=f"{outcome}.py",
        sha256="0",
        problem_id=1,
        outcome=outcome,  # type: ignore[arg-type]
        correct=outcome == "pass",
        speedup=speedup,
        speedup_low=None if speedup is None else speedup * 0.9,
        speedup_high=None if speedup is None else speedup * 1.1,
        credited=credited,
        **extra,
    )


BATCH = [
    _result("pass", 2.5, floor_speedup=4.0),
    _result("pass", 0.8, floor_speedup=3.0),
    _result("pass", 9.0, credited=False),  # below the floor: correct, speedup not credited
    _result("wrong"),
    _result("timeout"),
    _result("env"),  # the harness failed: not attempted
    _result("skipped"),
]


def test_scores_are_over_attempted_files_and_credited_speedups():
    s = eval_report.summarize(BATCH)
    assert (s.files, s.attempted, s.correct) == (7, 5, 3)
    assert s.correct_pct == pytest.approx(60.0)
    assert s.fast_p["0"] == pytest.approx(3 / 5)
    assert s.fast_p["0.5"] == pytest.approx(2 / 5) and s.fast_p["1"] == pytest.approx(1 / 5)
    assert s.fast_p["2"] == pytest.approx(1 / 5)
    assert s.geomean_speedup == pytest.approx(math.sqrt(2.5 * 0.8))
    assert s.outcomes == {"pass": 3, "wrong": 1, "timeout": 1, "env": 1, "skipped": 1}
    checked_only = eval_report.summarize([_result("pass"), _result("wrong")])
    assert list(checked_only.fast_p) == ["0"] and checked_only.geomean_speedup is None
    assert (s.generalizes, s.generalization_judged) == (0, 0)


def test_generalizing_files_are_counted_among_the_correct_ones_judged():
    results = [
        _result("pass", generalizes="yes"),
        _result("pass", generalizes="no"),
        _result("pass"),  # not judged (the trial was off)
        _result("wrong"),
    ]
    s = eval_report.summarize(results)
    assert (s.correct, s.generalizes, s.generalization_judged) == (3, 1, 2)
    report = _report().model_copy(update={"results": results, "summary": s})
    assert "| correct and generalizes (of those judged) | 1 of 2 |" in eval_report.to_markdown(report)
    assert "generalizes" not in eval_report.to_markdown(_report())


def _report() -> EvalReport:
    return EvalReport(
        settings=EvalSettings(world_size=2, device="cuda"),
        store="/tmp/x.sqlite",
        wall_s=1.0,
        resumed=0,
        results=BATCH,
        summary=eval_report.summarize(BATCH),
    )


def test_every_report_format_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    paths, notes = eval_report.write_reports(_report(), tmp_path)
    assert set(paths) == {"json", "csv", "md", "png"} and notes == []
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = EvalReport.model_validate_json(Path(paths["json"]).read_text())
    assert loaded.summary.correct == 3 and loaded.reports == paths
    rows = Path(paths["csv"]).read_text().splitlines()
    assert rows[0].startswith("file,problem_id,problem,backend,convention,outcome") and len(rows) == 8
    md = Path(paths["md"]).read_text()
    assert (
        "| pass.py | 1 |" in md and "| fast_1.5 | 0.200 |" in md and "9.000x (8.10-9.90) not credited" in md
    )


def test_without_matplotlib_the_png_is_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    paths, notes = eval_report.write_reports(_report(), tmp_path)
    assert "png" not in paths and notes == [eval_report.NO_MATPLOTLIB]
    assert not (tmp_path / "report.png").exists() and (tmp_path / "report.md").exists()


# ---------------------------------------------------------------- the example directory, end to end


class _Queue:
    """A scheduler stand-in: records submissions, runs nothing."""

    cluster = None

    def __init__(self) -> None:
        self.submitted: list[tuple[str, int, bool]] = []

    def submit(self, kind: str, request, first: bool = False, then=None) -> str:
        self.submitted.append((kind, request.problem, first))
        return f"job{len(self.submitted)}"


def test_build_slots_follow_the_node_or_the_setting(monkeypatch):
    from pkb_mcp import config

    monkeypatch.delenv("PKB_BUILD_SLOTS", raising=False)
    assert config.build_slots() >= 1
    monkeypatch.setenv("PKB_BUILD_SLOTS", "6")
    assert config.build_slots() == 6
    monkeypatch.setenv("PKB_BUILD_SLOTS", "many")
    with pytest.raises(ValueError, match="PKB_BUILD_SLOTS"):
        config.build_slots()


def readme_eval_line() -> list[str]:
    """The README's `pkb eval examples/original ...` line, as its words (so the test and the README
    cannot drift apart)."""
    readme = (ROOT / "README.md").read_text()
    lines = [line for line in readme.splitlines() if line.startswith("pkb eval examples/original ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


@pytest.mark.integration
@pytest.mark.slow
def test_the_readme_s_eval_of_the_example_directory_does_what_it_says(tmp_path, isolated_dirs):
    """Issue 51: the README's line, exactly (only its --out moved into the test's folder), as a user
    runs it: 001, 018 and 021 pass in the original's convention, 007 is wrong, 008 times out, 013
    does not build; correct 50%, fast_0 0.50; run again, all six come from the store."""
    words = readme_eval_line()
    assert words[:2] == ["pkb", "eval"] and "--out" in words
    out = tmp_path / "report"
    words[words.index("--out") + 1] = str(out)
    env = {k: v for k, v in os.environ.items() if k != "PKB_UNSEEN_SIZES"}  # the README's run has them
    env |= {"PKB_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pkb_mcp", *words[1:]]  # `pkb` is this interpreter's
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 1, done.stderr[-3000:]  # three files fail: the candidates' failures
    assert "| correct | 3 (50.0%) |" in done.stdout and "| fast_0 | 0.500 |" in done.stdout
    report = EvalReport.model_validate_json((out / "report.json").read_text())
    outcomes = {Path(r.file).name: r.outcome for r in report.results}
    assert outcomes == EXPECTED, [(r.file, r.message) for r in report.results]
    for r in report.results:
        assert r.convention == ("original" if r.outcome != "build" else None), r
        assert (r.speedup is not None) == (r.outcome == "pass")
    s = report.summary
    assert (s.attempted, s.correct) == (6, 3) and s.fast_p["0"] == pytest.approx(0.5)
    # the torch files are the reference's own code, timed on CPU: no evidence of a difference, so
    # nothing of theirs is credited unless it lands outside CPU's noise band, and the result says so
    passed = [r for r in report.results if r.outcome == "pass"]
    for r in passed:
        assert r.credited or "no evidence of a difference" in (r.message or ""), r
    credited = [r.speedup for r in passed if r.credited]
    assert (s.geomean_speedup is None) == (not credited)
    assert set(report.reports) == {"json", "csv", "md", "png"} or report.notes == [eval_report.NO_MATPLOTLIB]
    assert "| 008_alltoall_torch.py | 8 alltoall | original | timeout |" in (out / "report.md").read_text()
    # a file that passed was benchmarked next, ahead of the checks still queued (the check's `then`)
    from pkb_mcp.jobs.store import JobStore

    jobs = JobStore(Path(report.store))
    records = [jobs.get(j) for r in report.results for j in (r.check_job, r.bench_job) if j]
    started = [rec.id for rec in sorted(records, key=lambda rec: rec.started or 0.0)]
    benched = [r for r in report.results if r.bench_job]
    assert len(benched) == 3
    for r in benched:
        assert started[started.index(r.bench_job) - 1] == r.check_job, (r.file, started)

    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    second = EvalReport.model_validate_json((out / "report.json").read_text())
    assert again.returncode == 1 and second.resumed == 6 and all(r.reused for r in second.results)
    assert [r.model_dump(exclude={"reused"}) for r in second.results] == [
        r.model_dump(exclude={"reused"}) for r in report.results
    ]
    assert second.wall_s < 30, "nothing ran again"
    assert list(isolated_dirs.iterdir()) == []


def _done_rows(store: Path) -> int:
    try:
        with sqlite3.connect(store) as db:
            return db.execute("SELECT COUNT(*) FROM eval_results WHERE state='done'").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.integration
@pytest.mark.slow
def test_an_interrupted_eval_resumes_where_it_stopped(tmp_path, isolated_dirs):
    batch = tmp_path / "batch"
    batch.mkdir()
    for name in ("001_allreduce_torch.py", "007_reducescatter_torch.py", "018_tp_rms_norm_torch.py"):
        shutil.copy(EXAMPLES / name, batch / name)
    store = tmp_path / "eval.sqlite"
    cmd = [
        sys.executable,
        "-m",
        "pkb_mcp",
        "eval",
        str(batch),
        "--world-size",
        "2",
        "--device",
        "cpu",
    ]
    cmd += ["--trials", "1", "--no-bench", "--store", str(store), "--out", str(tmp_path / "out"), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as in a terminal: a shell's background job (pytest started with `&`) ignores SIGINT,
        # and so would the batch, which inherits it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while _done_rows(store) < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, "the batch ended before it could be interrupted"
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    done_before = _done_rows(store)
    assert first.returncode == 130 and "interrupted" in err, (first.returncode, done_before, err[-3000:])
    assert 1 <= done_before < 3

    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 1, second.stderr  # one candidate is wrong
    report = EvalReport.model_validate_json(second.stdout)
    assert report.resumed == done_before
    assert {Path(r.file).name: r.outcome for r in report.results} == {
        "001_allreduce_torch.py": "pass",
        "007_reducescatter_torch.py": "wrong",
        "018_tp_rms_norm_torch.py": "pass",
    }
    with sqlite3.connect(store) as db:
        checks = db.execute("SELECT COUNT(*) FROM jobs WHERE kind='check' AND state='done'").fetchone()[0]
    assert checks == 3, "every file was checked once, across both runs"
    assert list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
def test_environment_errors_are_kept_apart_from_candidate_failures(tmp_path, monkeypatch, isolated_dirs):
    """A file whose job fails in the harness (here: the reference of its problem, simulated) is an
    `env` outcome: not attempted, not in the scores; the batch goes on with the other files."""
    import dataclasses

    from pkb_mcp import service

    real = service.VERBS["check"]

    def flaky_check(request, *args, **kwargs):
        if int(request.problem) == 18:
            raise UserError("the reference of problem 18 failed on rank 0 (simulated)")
        return real.run(request, *args, **kwargs)

    monkeypatch.setitem(service.VERBS, "check", dataclasses.replace(real, run=flaky_check))
    batch = tmp_path / "batch"
    batch.mkdir()
    for name in ("001_allreduce_torch.py", "018_tp_rms_norm_torch.py"):
        shutil.copy(EXAMPLES / name, batch / name)
    (batch / "048_fsdp_and_tp_torch.py").write_text("def solution(x):\n    return x\n")
    (batch / "helper.py").write_text("")
    report = evaluate(
        [batch], world_size=2, device="cpu", trials=1, bench=False, sandbox="process", store=tmp_path / "s.db"
    )
    outcomes = {Path(r.file).name: (r.outcome, r.message) for r in report.results}
    assert outcomes["001_allreduce_torch.py"][0] == "pass"
    assert outcomes["018_tp_rms_norm_torch.py"] == (
        "env",
        "the reference of problem 18 failed on rank 0 (simulated)",
    )
    unrunnable = outcomes["048_fsdp_and_tp_torch.py"]  # not at world size 2
    assert unrunnable[0] == "skipped" and "cannot run at world size 2" in unrunnable[1]
    assert outcomes["helper.py"][0] == "skipped" and "no problem id" in outcomes["helper.py"][1]
    assert (report.summary.attempted, report.summary.correct, report.summary.correct_pct) == (1, 1, 100.0)


def test_a_second_batch_on_the_same_store_is_refused(tmp_path):
    from pkb_mcp.evaluation.store import EvalStore

    holder = EvalStore(tmp_path / "eval.sqlite")
    holder.acquire()
    try:
        with pytest.raises(UserError, match="another pkb eval is using"):
            evaluate([EXAMPLES / "001_allreduce_torch.py"], device="cpu", store=tmp_path / "eval.sqlite")
    finally:
        holder.release()


class _PooledStandIn:
    """A backend that records its warm pool's life instead of starting sandboxes; isolated, as Docker."""

    name = "stand-in"
    isolated = True

    def __init__(self) -> None:
        self.pool = None
        self.first: list[object] = []
        self.closed = 0

    def enable_pool(self, new_dir, harness_root, per_key=2, spare=0):
        outer = self
        self.spare = spare

        class Pool:
            def replenish(self, key, count=0):
                outer.first.append(key)

        self.pool = Pool()
        return self.pool

    def disable_pool(self) -> None:
        self.closed += 1
        self.pool = None


@pytest.mark.parametrize(("device", "failing"), [("cuda", False), ("cuda", True), ("cpu", False)])
def test_a_batch_on_gpus_keeps_warm_sandboxes_while_it_runs(tmp_path, monkeypatch, device, failing):
    """`pkb eval` starts its first checks' shape ahead of need on GPUs and stops its warm sandboxes when
    it ends, even when it ends by an exception; on a CPU device it keeps none."""
    import torch

    import sandbox
    from pkb_mcp.evaluation import batch
    from pkb_mcp.launches import warm_pool

    backend = _PooledStandIn()
    monkeypatch.setattr(sandbox, "select_backend", lambda name="auto": backend)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("PKB_PIN_CPUS", "0")
    during = []

    def run(self, files, attempt_of=None):
        during.append(warm_pool(backend))
        if failing:
            raise KeyboardInterrupt
        return []

    monkeypatch.setattr(batch._Batch, "run", run)
    ends = pytest.raises(KeyboardInterrupt) if failing else contextlib.nullcontext()
    with ends:
        evaluate(
            [EXAMPLES / "001_allreduce_torch.py"], world_size=2, device=device, store=tmp_path / "e.sqlite"
        )
    if device == "cuda":
        from pkb_mcp.launches import TOOL_SHAPE

        assert during[0] is not None, "no warm pool while the batch ran"
        key, tool = backend.first
        assert (key.device, key.gpus, key.world_size) == ("cuda", (0, 1), 2)
        assert tool == TOOL_SHAPE, "and a tool sandbox for its builds"
        assert backend.spare(key) == 6, "a batch keeps spare GPU sandboxes"
        assert backend.closed == 1 and backend.pool is None
    else:
        assert during == [None] and backend.first == [] and backend.closed == 0


class _EndedJobs:
    """A scheduler stand-in whose jobs have all ended: `results` maps a job to its result (None: failed)."""

    cluster = None

    def __init__(self, results: dict[str, CheckResult | None]) -> None:
        from types import SimpleNamespace

        self.results = results
        self.record = lambda job: SimpleNamespace(
            terminal=True, state="done" if results[job] else "failed", error="the engine went away"
        )

    def get(self, job):
        return self.record(job)

    def result(self, job):
        return self.results[job].model_dump(mode="json")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("ended", "kept"),
    [
        (_check("timeout", run.NOT_STARTED, ["timeout", "timeout"]), False),
        (None, False),  # the job failed: the environment's, not the file's
        (_check("timeout", run.TIMED_OUT, ["timeout", "timeout"]), True),
        (_check("fail", "rank 0: wrong", ["wrong", "pass"]), True),
    ],
)
def test_an_environment_failure_or_a_deadline_before_the_start_is_not_kept_as_the_verdict(
    tmp_path, ended, kept
):
    """Issue 51: the store replayed a launch's failure to start in time (and env) on every later run
    until --rerun; now such a result is this run's only, and a re-run tries the file again."""
    from pkb_mcp.evaluation.batch import _Batch, _Entry
    from pkb_mcp.evaluation.store import EvalStore

    store = EvalStore(tmp_path / "eval.sqlite")
    batch = _Batch(EvalSettings(bench=False), _EndedJobs({"j1": ended}), store, False, lambda *a: None)
    base = FileResult(file="001_allreduce_torch.py", sha256="0", problem_id=1, outcome="skipped")
    entry = _Entry(Path("001_allreduce_torch.py"), "key", base, stage="checking", job="j1")
    store.put("key", entry.path.name, "checking", check_job="j1")
    assert batch.advance(entry) and entry.result is not None
    assert entry.result.outcome == ("env" if ended is None else classify(ended))
    assert (store.get("key") is not None) == kept
    assert batch.not_kept == ([] if kept else ["001_allreduce_torch.py"])


def test_a_file_that_cannot_run_is_its_own_failure_told_before_any_job(tmp_path):
    """A file that does not parse, defines no solution() or takes no call of its problem is refused
    by pkb check before any launch; in a batch it is that file's `error`, and no job is queued."""
    from pkb_mcp.evaluation.batch import _Batch
    from pkb_mcp.evaluation.store import EvalStore

    submitted: list[object] = []

    class Scheduler:
        cluster = None

        def submit(self, *job, **options):
            submitted.append(job)
            return "job"

    files = {
        "001_syntax.py": ("def solution(x:\n", "the solution does not parse: 001_syntax.py:1: "),
        "001_nosol.py": ("import torch\n", "001_nosol.py defines no solution()"),
        "012_arity.py": ("def solution(x):\n    return x\n", "solution takes 1 parameter (x) here"),
    }
    settings = EvalSettings(world_size=2, device="cpu")
    batch = _Batch(settings, Scheduler(), EvalStore(tmp_path / "e.sqlite"), False, lambda *a: None)
    for name, (text, words) in files.items():
        path = tmp_path / name
        path.write_text(text)
        entry = batch.start(path, pair_files([path])[path])
        assert entry.stage == "done" and entry.result is not None
        assert (entry.result.outcome, entry.result.correct) == ("error", False)
        assert entry.result.message.startswith(words), entry.result.message
    assert submitted == []


def test_the_report_counts_one_file_and_one_trial_in_the_singular():
    """Issue 51: "1 files" (and "1 trials") in the report's first line."""
    one = _report().model_copy(update={"results": BATCH[:1], "summary": eval_report.summarize(BATCH[:1])})
    one.settings.trials = 1
    first = eval_report.to_markdown(one).splitlines()[2]
    assert first.startswith("1 file; ") and ", 1 trial, " in first, first
    assert eval_report.to_markdown(_report()).splitlines()[2].startswith(f"{len(BATCH)} files; ")
