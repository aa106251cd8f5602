"""`pkb eval`: a batch of solution files, each checked and, if correct, benchmarked; one report.

Files are named by problem: the original benchmark's `{id}_{name}_{backend}.py` or ours
`NNN_slug.py`; the name decides the problem, the id only where the name is no problem's
(pkb_mcp/runs/pairing.py), and a file that names no problem stops the batch before it runs. Each
file's check, then its benchmark, is a job of the scheduler (pkb_mcp/jobs/scheduler.py),
so the files' jobs spread over the node's GPUs as the scheduler allows and each runs in sandboxed launches
of its own. Per-file results are kept in a table beside the scheduler's jobs, in one SQLite file
(pkb_mcp/evaluation/store.py): a re-run skips what is done, and jobs an interrupted run left behind are
adopted, not submitted again. A crash, a hang or a failed build is that file's verdict; errors of the
harness or the environment are a category of their own, reported apart and left out of the scores
(docs/measurement.md defines correct %, fast_p and the geometric mean). With `attempts`, each path given
is one attempt of the whole set by one model, and the published table (pkb_mcp/evaluation/table.py)
gives best of k over them.

`evaluate` is the Python entry point: an evaluation script calls it without the CLI
(`from pkb_mcp.evaluation.batch import evaluate`). pkb_mcp/evaluation/report.py summarizes and writes
the report formats; pkb_mcp/evaluation/records.py holds the records they share.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pkb_mcp import config, problems, service
from pkb_mcp.errors import UserError
from pkb_mcp.evaluation import report as eval_report
from pkb_mcp.evaluation import table as eval_table
from pkb_mcp.evaluation.records import (
    EvalReport,
    EvalSettings,
    FileResult,
    Outcome,
)
from pkb_mcp.evaluation.store import EvalStore
from pkb_mcp.models import BenchResult, CheckResult, RunRequest
from pkb_mcp.runs import conventions, pairing, references, run, verdicts

POLL_S = 0.25

Progress = Callable[[int, int, str, str], None]  # (files done, files in all, file, what is happening)


# ---------------------------------------------------------------- files


def collect_files(paths: Iterable[str | Path]) -> list[Path]:
    """Directories (their *.py files), globs (`**` descends) and files, in order, each once."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            matches = sorted(p for p in path.glob("*.py") if not p.name.startswith(("_", ".")))
        elif path.is_file():
            matches = [path]
        else:
            matches = [Path(m) for m in sorted(glob.glob(str(path), recursive=True)) if Path(m).is_file()]
            if not matches:
                raise UserError(f"{raw} is not a file, a directory or a glob that matches files")
        for m in matches:
            if m.resolve() not in {f.resolve() for f in found}:
                found.append(m)
    if not found:
        raise UserError("no solution files found; pass files, directories or globs of .py files")
    return found


def collect_attempts(paths: Iterable[str | Path], attempts: bool) -> dict[Path, int]:
    """Each file and the index of its attempt: with `attempts`, each path (a directory or a glob) is one
    attempt of the whole set; without, every file is of attempt 0. A file in two attempts is an error."""
    if not attempts:
        return dict.fromkeys(collect_files(paths), 0)
    found: dict[Path, int] = {}
    seen: dict[Path, int] = {}
    for index, path in enumerate(paths):
        for f in collect_files([path]):
            if f.resolve() in seen:
                raise UserError(
                    f"{f} is in attempt {seen[f.resolve()] + 1} and attempt {index + 1}; with --attempts "
                    "each path is one attempt, and a file belongs to one"
                )
            seen[f.resolve()] = index
            found[f] = index
    return found


def pair_files(files: list[Path]) -> dict[Path, pairing.Pairing]:
    """Each file's problem, by its name (pkb_mcp/runs/pairing.py); one error naming every file that
    pairs with no problem, before anything runs."""
    paired: dict[Path, pairing.Pairing] = {}
    unknown: list[str] = []
    for path in files:
        try:
            paired[path] = pairing.pair(path)
        except UserError as exc:
            unknown.append(str(exc))
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise UserError(
            f"{len(unknown)} file(s) name no problem, so nothing was run: "
            + "; ".join(unknown[:5])
            + more
            + ". Rename them, or leave them out of the paths"
        )
    return paired


# ---------------------------------------------------------------- outcomes


def classify(result: CheckResult | BenchResult) -> Outcome:
    """The category of a candidate's check or benchmark: `build` only where a rank failed on a build
    (a build that failed but was never loaded is no cause), `error` where the candidate raised."""
    if result.verdict in ("pass", "suspect"):
        return "pass"
    if "ConventionError" in result.message or all(
        r.message.startswith("not run: ") for r in result.ranks if r.state != "pass"
    ):
        return "refused"  # a stated difference from the original, or a refusal before running
    if result.verdict == "timeout":
        return "timeout"
    if verdicts.failed_to_build(result.ranks):
        return "build"
    states = {r.state for r in result.ranks}
    if "wrong" in states and not states & {"error", "crashed", "exited", "timeout"}:
        return "wrong"
    return "error"


def started_too_late(result: CheckResult | BenchResult) -> bool:
    """Whether a deadline came before the candidate's ranks had started (run.NOT_STARTED): a
    deadline too short for the machine, which says nothing of the file, so a re-run tries it again."""
    late = [r for r in result.ranks if r.state == "timeout"]
    return result.verdict == "timeout" and bool(late) and all(r.message == run.NOT_STARTED for r in late)


def _by_original_rules(base: FileResult, outcome: Outcome, named: list[str]) -> dict[str, Any]:
    """In the original variant: whether the file is correct by the original benchmark's rules (it
    passed, or only pkb's protections failed it) and which protections failed it."""
    if base.variant == "pkb":
        return {}
    return {"original_correct": outcome == "pass" or bool(named), "protections": named}


def _from_check(base: FileResult, r: CheckResult, job: str) -> FileResult:
    outcome = classify(r)
    return base.model_copy(
        update={
            "problem": r.problem,
            "convention": conventions.used_in(r.notes),
            "outcome": outcome,
            "correct": outcome == "pass",
            "message": r.message,
            "generalizes": r.generalizes,
            "check_job": job,
            **_by_original_rules(base, outcome, r.protections),
        }
    )


def _from_bench(checked: FileResult, b: BenchResult, job: str, device: str) -> FileResult:
    outcome = classify(b)
    update: dict[str, Any] = {"outcome": outcome, "correct": outcome == "pass", "bench_job": job}
    update.update(_by_original_rules(checked, outcome, b.protections))
    update["message"] = b.message
    if b.candidate is not None and b.speedup is not None:
        update.update(
            speedup=b.speedup,
            speedup_low=b.speedup_low,
            speedup_high=b.speedup_high,
            candidate_ms=b.candidate.median_ms,
            credited=b.verdict == "pass" and not b.within_noise,
        )
    if b.reference is not None:
        update["reference_ms"] = b.reference.median_ms
    if device == "cuda" and b.roofline is not None:
        update["floor_ms"] = b.roofline.floor_ms
        update["pct_of_floor"] = b.roofline.pct_of_floor
        if b.reference is not None and b.roofline.floor_ms > 0:
            update["floor_speedup"] = b.reference.median_ms / b.roofline.floor_ms
    return checked.model_copy(update=update)


# ---------------------------------------------------------------- the batch


@dataclass
class _Entry:
    path: Path
    key: str
    base: FileResult
    stage: str = "done"  # checking, benchmarking, done
    job: str | None = None
    result: FileResult | None = None
    checked: FileResult | None = None  # the check's result while its benchmark runs
    extra: dict[str, Any] = field(default_factory=dict)
    bench_job: str | None = None  # submitted at its check's end, before the batch's loop saw that end


class _Batch:
    """One batch's files through their stages: checked, and a file that passes benchmarked ahead of the
    checks still queued. (On GPUs the scheduler builds a file's extensions before its check takes GPUs:
    pkb_mcp/jobs/scheduler.py.)"""

    def __init__(
        self, settings: EvalSettings, scheduler: Any, store: EvalStore, rerun: bool, progress: Progress
    ):
        self.s = settings
        self.scheduler = scheduler
        self.store = store
        self.rerun = rerun
        self.progress = progress
        self._follow = threading.Lock()  # the scheduler's hook (follow_up) and the loop's advance
        self.not_kept: list[str] = []  # files whose result this run is not kept as their verdict

    def request(self, path: Path, pid: int, kind: str) -> RunRequest:
        check = kind == "check"
        return RunRequest(
            problem=pid,
            path=str(path.resolve()),
            world_size=self.s.world_size,
            size=self.s.size,
            variant=self.s.variant,
            device=self.s.device,
            sandbox=self.s.sandbox,
            convention=self.s.convention,
            trials=self.s.trials,
            unseen=self.s.unseen,
            timeout_s=self.s.timeout_s if check else self.s.bench_timeout_s,
        )

    def start(self, path: Path, paired: pairing.Pairing) -> _Entry:
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        pid = paired.problem.id if paired.problem is not None else None
        base = FileResult(
            file=str(path),
            sha256=sha,
            problem_id=pid,
            variant=self.s.variant,
            backend=paired.backend,
            pairing=paired.remark,
            outcome="skipped",
        )
        key = hashlib.sha256(
            json.dumps([str(path.resolve()), sha, pid, self.s.model_dump()]).encode()
        ).hexdigest()
        entry = _Entry(path, key, base)
        if pid is None:
            entry.result = base.model_copy(
                update={"message": "no problem id in the file name (NNN_slug.py or {id}_{name}_{backend}.py)"}
            )
            return entry
        try:
            problem, _ = service.preflight(
                pid,
                self.s.world_size,
                self.s.size,
                self.s.device,
                local_gpus=self.scheduler.cluster is None,
                variant=self.s.variant,
            )
        except UserError as exc:
            entry.result = base.model_copy(update={"message": str(exc)})
            return entry
        entry.base = base = base.model_copy(update={"problem": problem.name})
        # a file that cannot run at all (it does not parse, defines no solution(), takes no call of
        # its problem): the candidate's failure, told before any launch, as pkb check refuses it
        try:
            why = run.unrunnable(problem, path, self.s.world_size, self.s.size, self.s.convention)
        except UserError as exc:
            why = str(exc)
        if why is not None:
            entry.result = base.model_copy(update={"outcome": "error", "message": why})
            return entry
        row = self.store.get(key)
        if row is not None and self.rerun:
            for job in (row["check_job"], row["bench_job"]):
                record = self.scheduler.store.get(job) if job else None
                if record is not None and not record.terminal:
                    self.scheduler.cancel(job, "re-run asked for")
            row = None
        if row is not None and row["state"] == "done" and row["result"] and row["result"]["outcome"] != "env":
            entry.result = FileResult.model_validate({**row["result"], "reused": True})
            return entry
        if row is not None and self._adoptable(row["bench_job"]) and row["result"]:
            entry.stage, entry.job = "benchmarking", row["bench_job"]
            entry.checked = FileResult.model_validate(row["result"])
            return entry
        if row is not None and self._adoptable(row["check_job"]):
            entry.stage, entry.job = "checking", row["check_job"]
            return entry
        self._submit_check(entry, pid)
        return entry

    def _submit_check(self, entry: _Entry, pid: int) -> None:
        entry.stage = "checking"
        entry.job = self.scheduler.submit(
            "check", self.request(entry.path, pid, "check"), then=partial(self.follow_up, entry)
        )
        self.store.put(entry.key, str(entry.path), "checking", check_job=entry.job)

    def follow_up(self, entry: _Entry, job: str) -> None:
        """At the end of an entry's check, in the scheduler's thread before its GPUs go to the next
        job: a file that passed has its benchmark queued first now. By the time the batch's loop sees
        the check's end, the next file's check would have taken the GPUs."""
        with self._follow:
            if entry.stage != "checking" or entry.job != job or entry.bench_job is not None:
                return
            raw = self.scheduler.result(job) if self.scheduler.get(job).state == "done" else None
            if raw is None or not self.s.bench:
                return
            checked = _from_check(entry.base, CheckResult.model_validate(raw), job)
            if checked.outcome == "pass":
                entry.bench_job = self._submit_bench(entry, checked)

    def _adoptable(self, job: str | None) -> bool:
        """A job of an earlier run that is still queued or running (re-queued on restart), or done."""
        if not job:
            return False
        record = self.scheduler.store.get(job)
        return record is not None and record.state in ("queued", "running", "done")

    def advance(self, entry: _Entry) -> bool:
        """Move an entry on when its job has ended; True when it changed."""
        assert entry.job is not None
        record = self.scheduler.get(entry.job)
        if not record.terminal:
            return False
        raw = self.scheduler.result(entry.job) if record.state == "done" else None
        if raw is None:  # the service refused or failed: the environment, not the candidate
            why = record.error or f"the job ended {record.state}"
            done = (entry.checked or entry.base).model_copy(
                update={"outcome": "env", "correct": False, "message": why}
            )
            self.finish(entry, done, keep=False)
            return True
        if entry.stage == "checking":
            check = CheckResult.model_validate(raw)
            checked = _from_check(entry.base, check, entry.job)
            if checked.outcome != "pass" or not self.s.bench:
                self.finish(entry, checked, keep=not started_too_late(check))
                return True
            entry.checked = checked
            with self._follow:
                entry.job = entry.bench_job or self._submit_bench(entry, checked)
                entry.stage = "benchmarking"
            self.store.put(
                entry.key,
                str(entry.path),
                "benchmarking",
                check_job=checked.check_job,
                bench_job=entry.job,
                result=checked.model_dump(mode="json"),
            )
            return True
        assert entry.checked is not None
        bench = BenchResult.model_validate(raw)
        self.finish(
            entry,
            _from_bench(entry.checked, bench, entry.job, self.s.device),
            keep=not started_too_late(bench),
        )
        return True

    def _submit_bench(self, entry: _Entry, checked: FileResult) -> str:
        return self.scheduler.submit(
            "bench", self.request(entry.path, checked.problem_id or 0, "bench"), first=True
        )

    def finish(self, entry: _Entry, result: FileResult, keep: bool = True) -> None:
        """The entry's result, kept in the store as the file's verdict unless `keep` is False (the
        environment failed, or a deadline came before the ranks started): a re-run tries it again."""
        entry.result, entry.stage, entry.job = result, "done", None
        if not keep:
            self.store.forget(entry.key)
            self.not_kept.append(entry.path.name)
            return
        self.store.put(
            entry.key,
            str(entry.path),
            "done",
            check_job=result.check_job,
            bench_job=result.bench_job,
            result=result.model_dump(mode="json"),
        )

    def run(
        self, files: dict[Path, pairing.Pairing], attempt_of: dict[Path, int] | None = None
    ) -> list[FileResult]:
        """Every file's result, each with its attempt (`attempt_of`; default 0): the attempt is the
        path's place on this command line, not a setting of the run, so a reused result takes it too."""
        total = len(files)
        entries = [self.start(path, paired) for path, paired in files.items()]
        skipped = [e for e in entries if e.result is not None and e.result.outcome == "skipped"]
        if len(skipped) == len(entries):  # nothing would run: bad input, not a batch that passed
            why = "; ".join(f"{e.path.name}: {e.result.message}" for e in skipped[:3] if e.result)
            more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
            raise UserError(f"no file of the batch can run, so nothing was run: {why}{more}")
        for i, e in enumerate(entries):
            self.progress(self._done(entries[: i + 1]), total, e.path.name, self._what(e))
        said = ""
        while any(e.stage != "done" for e in entries):
            changed = False
            for e in entries:
                if e.stage != "done" and self.advance(e):
                    changed = True
                    self.progress(self._done(entries), total, e.path.name, self._what(e))
            if not changed:
                said = self._heartbeat(entries, total, said)
                time.sleep(POLL_S)
        attempts = attempt_of or {}
        return [
            e.result.model_copy(update={"attempt": attempts.get(e.path, 0)})
            for e in entries
            if e.result is not None
        ]

    def _heartbeat(self, entries: list[_Entry], total: int, said: str) -> str:
        """What the first running job says it is doing, when that changed (its progress message)."""
        for e in entries:
            record = self.scheduler.store.get(e.job) if e.stage != "done" and e.job else None
            if record is not None and record.state == "running" and record.message:
                line = f"{e.stage}: {record.message}"
                if line != said:
                    self.progress(self._done(entries), total, e.path.name, line)
                return line
        return said

    @staticmethod
    def _done(entries: list[_Entry]) -> int:
        return sum(e.stage == "done" for e in entries)

    @staticmethod
    def _what(e: _Entry) -> str:
        if e.stage != "done":
            return e.stage
        assert e.result is not None
        reused = " (from an earlier run)" if e.result.reused else ""
        speed = "" if e.result.speedup is None else f", {e.result.speedup:.3f}x"
        if e.result.speedup is not None and not e.result.credited:  # within noise, or suspect
            speed = f", not credited ({e.result.speedup:.3f}x measured)"
        return f"{e.result.outcome}{speed}{reused}"


def _quiet(done: int, total: int, file: str, message: str) -> None:
    return None


def _wait_stopped(scheduler: Any, timeout_s: float = 60.0) -> None:
    """After stop(), the jobs that were running are killed and re-queued by their threads: wait for
    that (their sandboxes removed) before this process may exit, so none is left behind."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(r.state == "running" for r in scheduler.store.unfinished()):
            return
        time.sleep(POLL_S)


def evaluate(
    paths: Iterable[str | Path],
    *,
    world_size: int = 4,
    device: str | None = None,
    size: str = "pkb",
    variant: str = "pkb",
    trials: int = 5,
    timeout_s: float = 120.0,
    bench_timeout_s: float = 300.0,
    sandbox: str = "auto",
    convention: str = "auto",
    bench: bool = True,
    unseen: bool | None = None,
    rerun: bool = False,
    attempts: bool = False,
    store: Path | None = None,
    out_dir: Path | None = None,
    progress: Progress = _quiet,
    ray: str | None = None,
    warm: bool = True,
) -> EvalReport:
    """Check, and benchmark where correct, every solution file under `paths`; summarize; write the
    report formats into `out_dir` when given. Resumes from `store` (default $PKB_STATE_DIR/eval.sqlite).
    `attempts`: each of `paths` is one attempt of the whole set, for best of k in the published table.
    `ray`: the address of a Ray cluster whose nodes run the jobs (docs/scale-out.md). `warm`: keep
    sandboxes started ahead of need (sandbox/pool.py), as a server does: a batch is many launches of
    the same shape (on GPUs)."""
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore
    from pkb_mcp.launches import kept_warm, warm_key
    from sandbox import SandboxUnavailable, select_backend

    t0 = time.monotonic()
    RunRequest.of(path="", world_size=world_size, device=device, trials=trials, timeout_s=timeout_s)
    RunRequest.of(path="", variant=variant, sandbox=sandbox, convention=convention, timeout_s=bench_timeout_s)
    paths = list(paths)
    attempt_of = collect_attempts(paths, attempts)
    files = pair_files(list(attempt_of))
    cluster = None
    if ray is not None:
        from pkb_mcp.jobs.cluster import RayCluster

        cluster = RayCluster(ray)
        cluster.admit(
            "check", RunRequest(path="", world_size=world_size)
        )  # no node large enough: say so before any work
        device = device or ("cuda" if max(cluster.node_gpus(), default=0) else "cpu")
    device = device or service.default_device()
    try:
        # on a cluster, the nodes' backends run the jobs
        backend = select_backend(sandbox) if cluster is None else None
    except SandboxUnavailable as exc:
        raise UserError(str(exc)) from exc
    settings = EvalSettings(
        world_size=world_size,
        device=device,
        size=size,
        variant=variant,
        trials=trials,
        timeout_s=timeout_s,
        bench_timeout_s=bench_timeout_s,
        sandbox=sandbox,
        convention=conventions.requested(convention),
        bench=bench,
        unseen=config.unseen_sizes() if unseen is None else unseen,
    )
    store_path = (store or config.state_dir() / "eval.sqlite").expanduser().resolve()
    gpus = 0
    if device == "cuda" and cluster is None:
        import torch

        gpus = torch.cuda.device_count()
    # sandboxes started ahead of need, as a server keeps them: a batch is many launches of one shape,
    # each of which would otherwise start its ranks cold. On GPUs only: a CPU job uses every core, and
    # sandboxes warming up beside it would take them.
    warmth: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if warm and backend is not None and device == "cuda":
        first = warm_key(device, list(range(world_size)), world_size, 1) if gpus >= world_size else None
        warmth = kept_warm(backend, first)
    results_store = EvalStore(store_path)
    results_store.acquire()
    scheduler = None
    with warmth, references.STOCK.expecting(_checks_of_each_problem(files, variant)):
        try:
            scheduler = Scheduler(JobStore(store_path), gpus, cluster=cluster)
            batch = _Batch(settings, scheduler, results_store, rerun, progress)
            results = batch.run(files, attempt_of)
        finally:
            if scheduler is not None:
                scheduler.stop()
                _wait_stopped(scheduler)
            results_store.release()
    notes = []
    if batch.not_kept:
        notes.append(
            f"not kept in the store, so a re-run tries them again: {', '.join(batch.not_kept)} (the "
            "environment failed, or a deadline came before the ranks had started)"
        )
    return _report(settings, store_path, t0, results, len(paths) if attempts else 1, out_dir, notes)


def _checks_of_each_problem(files: dict[Path, pairing.Pairing], variant: str) -> dict[str, int]:
    """How many of the batch's files each problem's reference will be checked against, by its file: a
    check's reference launch runs the next ones' reference trials ahead (runs/references.py)."""
    counts: dict[str, int] = {}
    for paired in files.values():
        if paired.problem is None:
            continue
        try:
            path = str(problems.resolve(paired.problem.id, variant).path)
        except UserError:
            continue
        counts[path] = counts.get(path, 0) + 1
    return counts


def _report(
    settings: EvalSettings,
    store_path: Path,
    t0: float,
    results: list[FileResult],
    attempts: int,
    out_dir: Path | None,
    notes: list[str] | None = None,
) -> EvalReport:
    """The batch's report, with its summary and published table; its formats written into `out_dir`."""
    report = EvalReport(
        settings=settings,
        store=str(store_path),
        wall_s=round(time.monotonic() - t0, 3),
        resumed=sum(r.reused for r in results),
        results=results,
        summary=eval_report.summarize(results),
        table=eval_table.published_table(
            results,
            eval_table.suite_categories(),
            attempts=attempts,
            benched=settings.bench,
            without_exchange=eval_table.passable_without_exchange(
                {eval_table.variant_of(r) for r in results}, settings.world_size
            ),
        ),
        notes=notes or [],
    )
    if out_dir is not None:
        report.reports, written = eval_report.write_reports(report, out_dir)
        report.notes += written
    return report
