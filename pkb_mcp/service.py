"""The service layer: one function per verb, shared by the CLI and the MCP server.

Each function validates its input (raising UserError with one actionable sentence), runs the
needed jobs through a sandbox backend, judges on the host and returns a model from pkb_mcp.models.
"""

from __future__ import annotations

import ast
import contextlib
import json
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import tensorfile, timing
from pkb_mcp import config, conventions, judge, problems, roofline, static_report, stats
from pkb_mcp.errors import UserError
from pkb_mcp.jobs import JobOutcome, JobRequest, RankFate, ToolJobs, prestart, run_job, warm_pool
from pkb_mcp.models import (
    BenchResult,
    Calibration,
    CheckResult,
    InputSpec,
    ProblemDetail,
    ProblemSummary,
    RankResult,
    RooflineResult,
    SandboxInfo,
    StaticReport,
    TimingStats,
    Traffic,
)
from sandbox import SandboxUnavailable, select_backend
from sandbox.base import Backend

Progress = Callable[[float, float | None, str], None]
MAX_SOLUTION_BYTES = 1 << 20
MAX_TRIALS = 100
MAX_PLACEMENTS = 16
MAX_JOBS = 8
# what `jobs` buys, as measured (docs/gpu-results.md, runs F and I): the MCP tool and the CLI say it
JOBS_HELP = "separate jobs per side, alternating: more resolve smaller differences (docs/measurement.md)"
RANK_STATE_ORDER = ["pass", "wrong", "exited", "aborted", "error", "crashed", "timeout"]
# A median below this fraction of the roofline's bandwidth/compute floor is physically impossible
# (the slack covers traffic models that round up and ceilings a kernel can beat a little).
FLOOR_SLACK = 0.8


def _noop(progress: float, total: float | None, message: str) -> None:
    return None


# ---------------------------------------------------------------- problems


def _summary(p: problems.Problem) -> ProblemSummary:
    return ProblemSummary(
        id=p.id,
        name=p.name,
        category=p.category,
        source=p.source,
        dtype=p.dtype,
        world_sizes=p.world_sizes,
        summary=p.summary,
    )


def list_problems(category: str | None = None, text: str | None = None) -> list[ProblemSummary]:
    """Problems in id order, filtered by category (exact, case-insensitive) and free text."""
    found = []
    for p in problems.suite().values():
        if category and p.category.lower() != category.lower():
            continue
        haystack = " ".join([p.name, p.summary, p.source, p.category, p.description]).lower()
        if text and text.lower() not in haystack:
            continue
        found.append(_summary(p))
    return found


def _check_world_size(p: problems.Problem, world_size: int, size: str) -> None:
    if world_size < 1:
        raise UserError(f"world size {world_size} is not positive; pass --world-size 2 or more")
    reason = p.world_size_error(world_size, size)
    if reason:
        raise UserError(
            f"problem {p.id} ({p.name}) cannot run at world size {world_size} with size {size!r}: "
            f"{reason} (rule: {p.world_sizes})"
        )


def show_problem(ref: int | str, world_size: int = 4, size: str = "pkb") -> ProblemDetail:
    p = problems.resolve(ref)
    _check_world_size(p, world_size, size)
    t = p.traffic(world_size, size)
    return ProblemDetail(
        **_summary(p).model_dump(),
        description=p.description,
        signature=p.signature,
        world_size=world_size,
        size_preset=size,
        size=p.size(size),
        sizes=p.sizes,
        tolerance=p.bounds,
        mutates_inputs=p.mutates_inputs,
        inputs=[InputSpec(**spec) for spec in p.input_shapes(world_size, size)],
        traffic=Traffic(
            nvlink_bytes=t["nvlink_bytes"], hbm_bytes=t["hbm_bytes"], flops=t["flops"], rounds=t["rounds"]
        ),
        reference_source=p.path.read_text(),
        original=conventions.describe(p, world_size, size),
    )


def calibrate(
    world_size: int | None = None, device: str | None = None, timeout_s: float = 900.0
) -> Calibration:
    """Measure this node's ceilings (harness/calibrate.py, in a child process) and, on GPUs, save them
    where the roofline reads them. On CPU it is a dry run: nothing is saved."""
    import datetime
    import subprocess
    import sys
    import tempfile

    device = device or default_device()
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        world_size = world_size or count
        if not 2 <= world_size <= count:
            raise UserError(f"calibration needs 2 to {count} GPUs here, not {world_size}")
    else:
        world_size = world_size or 2
        if world_size < 2:
            raise UserError("calibration needs at least 2 ranks")
    with tempfile.TemporaryDirectory(prefix="pkb-calibrate-") as tmp:
        out = Path(tmp) / "calibration.json"
        cmd = [sys.executable, "-m", "harness.calibrate", "--world-size", str(world_size), "--device", device]
        try:
            done = subprocess.run(
                [*cmd, "--out", str(out)],
                cwd=config.HARNESS_ROOT,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise UserError(f"calibration did not finish within {timeout_s:g} s") from exc
        if done.returncode != 0 or not out.is_file():
            raise UserError(f"calibration failed: {done.stderr.strip()[-500:]}")
        measured = json.loads(out.read_text())
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    c = roofline.from_measurements(measured, when)
    saved = roofline.save_calibration(c, measured["details"]) if device == "cuda" else None
    return Calibration(ceilings=c, details=measured["details"], saved_to=saved)


def roofline_of(
    ref: int | str, world_size: int = 4, size: str = "pkb", time_ms: float | None = None
) -> RooflineResult:
    p = problems.resolve(ref)
    _check_world_size(p, world_size, size)
    if time_ms is not None and time_ms <= 0:
        raise UserError(f"time {time_ms} ms is not positive; pass --time-ms with a measured time")
    return roofline.floor(p.id, p.name, world_size, size, p.traffic(world_size, size), p.dtype, time_ms)


# ---------------------------------------------------------------- compile

BUILD_TIMEOUT_S = 600.0  # discovering and building a solution's extensions before its jobs


def compile_file(path: Path, sandbox: str = "auto", cancel: threading.Event | None = None) -> Any:
    """Build a .cu file or a solution's extensions: every import and compiler run is a sandbox job."""
    from pkb_mcp import compile as nvcc

    try:
        backend = select_backend(sandbox)
    except SandboxUnavailable as exc:
        raise UserError(str(exc)) from exc
    try:
        result = nvcc.compile_file(
            path, cache_dir=config.cache_dir() / "compile", tools=ToolJobs(backend, cancel)
        )
    except nvcc.CompileError as exc:
        raise UserError(str(exc)) from exc
    notes = [] if backend.isolated else [backend.note]
    return result.model_copy(update={"sandbox": backend.name, "notes": [*notes, *result.notes]})


# ---------------------------------------------------------------- running candidates


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _gpus_for(device: str, world_size: int) -> list[int]:
    if device == "cpu":
        return []
    import torch

    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU is visible on this machine; pass --device cpu")
    count = torch.cuda.device_count()
    if world_size > count:
        raise UserError(
            f"world size {world_size} needs {world_size} GPUs and this node has {count}; "
            f"pass --world-size {count} or fewer"
        )
    return list(range(world_size))


def _read_solution(path: Path) -> str | None:
    """Validates the solution file; returns a syntax-error message (a candidate failure) or None."""
    if not path.is_file():
        raise UserError(
            f"solution file {path} does not exist; pass the path of a .py file defining solution()"
        )
    size = path.stat().st_size
    if size == 0:
        raise UserError(
            f"solution file {path} is empty; it must define solution() with the reference's signature"
        )
    if size > MAX_SOLUTION_BYTES:
        raise UserError(f"solution file {path} is {size} bytes, over the {MAX_SOLUTION_BYTES}-byte limit")
    try:
        ast.parse(path.read_bytes(), filename=path.name)
    except SyntaxError as exc:
        return f"{path.name}:{exc.lineno}: {exc.msg}"
    except ValueError as exc:
        return f"{path.name}: {exc}"
    return None


# True on a server whose jobs run on a cluster's nodes (pkb_mcp/cluster.py): its own GPUs do not count
GPUS_ELSEWHERE = False


def preflight(
    ref: int | str, world_size: int, size: str, device: str | None, timeout_s: float = 60.0
) -> tuple[problems.Problem, str]:
    """Everything about a run request that can be refused before any work starts."""
    problem = problems.resolve(ref)
    _check_world_size(problem, world_size, size)
    if timeout_s <= 0:
        raise UserError(f"timeout {timeout_s} s is not positive; pass a time limit in seconds")
    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise UserError(f"device {device!r} is not cpu or cuda")
    if not GPUS_ELSEWHERE:
        _gpus_for(device, world_size)
    return problem, device


class _Run:
    """Common set-up of check and bench: problem, sizes, device, backend."""

    def __init__(
        self,
        ref: int | str,
        solution: Path,
        world_size: int,
        device: str | None,
        size: str,
        timeout_s: float,
        sandbox: str,
        gpus: list[int] | None = None,
        convention: str = "auto",
    ):
        self.t0 = time.monotonic()
        self.convention = conventions.requested(convention)
        self.problem, self.device = preflight(ref, world_size, size, device, timeout_s)
        self.gpus = gpus if gpus is not None and self.device == "cuda" else _gpus_for(self.device, world_size)
        self.world_size = world_size
        self.size = size
        self.timeout_s = timeout_s
        self.solution = solution.resolve()
        self.syntax_error = _read_solution(self.solution)
        # what the source still calls, read without running it; multicast refuses it outright
        self.static_report: StaticReport | None = None
        self.refusal: str | None = None
        if self.syntax_error is None:
            try:
                self.static_report = static_report.analyze(self.solution.read_bytes(), self.solution.name)
                self.refusal = static_report.refusal(self.static_report)
            except (SyntaxError, ValueError, RecursionError):
                self.static_report = None
        try:
            self.backend: Backend = select_backend(sandbox)
        except SandboxUnavailable as exc:
            raise UserError(str(exc)) from exc
        self.sandbox = SandboxInfo(
            backend=self.backend.name, isolated=self.backend.isolated, note=self.backend.note
        )
        self.warnings = [] if self.backend.isolated else [self.backend.note]
        self.notes: list[str] = []

    def prepare_extensions(self, progress: Progress, cancel: threading.Event | None) -> None:
        """Build the solution's load_inline extensions into the node's cache before its jobs run
        (pkb_mcp/extensions.py); a solution without any costs nothing here."""
        from pkb_mcp import extensions

        text = self.solution.read_text(encoding="utf-8", errors="replace")
        if not extensions.may_build(text):
            return
        progress(0, 3, "finding and building the solution's extensions")
        prepared = extensions.prepare(text, ToolJobs(self.backend, cancel), BUILD_TIMEOUT_S)
        self.notes += prepared.notes()

    def request(self, mode: str, solution: Path, seeds: list[int], timing: dict | None = None) -> JobRequest:
        import os

        threads = 1 if self.device == "cuda" else max(1, (os.cpu_count() or 1) // self.world_size)
        return JobRequest(
            mode=mode,
            problem_path=self.problem.path,
            solution_path=solution,
            world_size=self.world_size,
            device=self.device,
            gpus=self.gpus,
            size=self.problem.size(self.size),
            dtype=self.problem.dtype,
            seeds=seeds,
            tolerance=self.problem.bounds,
            timeout_s=self.timeout_s,
            timing=timing,
            threads_per_rank=threads,
            convention=self.convention,
        )

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)


def _refused_ranks(run: _Run) -> list[RankResult]:
    return [
        RankResult(rank=r, state="error", message="not run: " + (run.refusal or ""))
        for r in range(run.world_size)
    ]


def _fate_result(fate: RankFate) -> RankResult:
    error = fate.error.strip().splitlines()[0][:300] if fate.error.strip() else ""
    messages = {
        "error": f"raised {error}" + (f" during {fate.stage}" if fate.stage else ""),
        "crashed": f"crashed ({fate.signal or error or 'no status'})",
        "timeout": "still running at the deadline (deadlock or too slow); killed",
        "aborted": "killed after another rank failed (it was likely waiting in a collective)",
        "exited": "exited with status 0 before finishing the job",
    }
    return RankResult(
        rank=fate.rank,
        state=fate.state,
        message=messages.get(fate.state, fate.state),  # type: ignore[arg-type]
        traceback=fate.traceback or None,
        log_tail=fate.log_tail[-2000:] or None,
        ended_s=fate.ended_s or None,
    )


def _refused_timing(ranks: list[RankResult], cand: JobOutcome, mac_key: bytes) -> tuple[str, str] | None:
    """(verdict, why) when a candidate's benchmark job gives no time to use: wrong outputs, no
    timing record, a forged one, timed outputs that changed, or inputs it changed; else None."""
    verdict, why = _verdict(ranks)
    if verdict != "pass" or cand.timing is None:
        return verdict, why or "the candidate recorded no timing"
    record = cand.timing
    if not tensorfile.verify_record(mac_key, record):
        return (
            "fail",
            "the timing record was altered after the harness wrote it (a forged result file); "
            "no time of this run is used",
        )
    if record.get("timed_output_mismatches"):
        first = record["timed_output_mismatches"][0]
        rotated = (
            " (between rounds the harness moves other data into the same input buffers: a result "
            "cached by buffer address goes stale)"
            if record.get("rotated_inputs")
            else ""
        )
        return (
            "fail",
            f"a timed call's output (call {first}) differs from the judged output of "
            f"the same inputs; results must be right on every call{rotated}",
        )
    if record.get("inputs_mutated_while_timing"):
        return "fail", "the solution changed its inputs while being timed; inputs are read-only"
    return None


def _reference_failed(p: problems.Problem, outcome: JobOutcome) -> UserError:
    bad = next(r for r in outcome.ranks if r.state != "ok")
    detail = bad.error or bad.state
    return UserError(
        f"the reference of problem {p.id} failed on rank {bad.rank} ({detail}); the environment "
        f"cannot run this problem here: check the device and world size. Log: {bad.log_tail[-400:]}"
    )


def _judge(
    p: problems.Problem,
    world_size: int,
    keys: list[int],
    cand: JobOutcome,
    ref: JobOutcome,
    mac_key: bytes | None = None,
    fresh: bool = False,
) -> list[RankResult]:
    """Each rank's worst outcome over the trials (or timed input sets; with `fresh`, the timed calls
    on fresh input sets), in rank order.

    With `mac_key` (derived from the job's secret seeds), every candidate output file must carry the
    keyed digest the harness wrote into it: a file rewritten after the harness wrote it is rejected.
    """
    wants = ref.fresh_outputs if fresh else ref.outputs
    gots = cand.fresh_outputs if fresh else cand.outputs
    errors = cand.fresh_output_errors if fresh else cand.output_errors
    results = []
    for rank in range(world_size):
        fate = cand.ranks[rank]
        if fate.state != "ok":
            results.append(_fate_result(fate))
            continue
        worst: RankResult | None = None
        for key in keys:
            want = wants.get((key, rank))
            got = gots.get((key, rank))
            if want is None:
                raise UserError(
                    f"the reference of problem {p.id} left no output for rank {rank}; "
                    "the job directory may be full"
                )
            if got is None:
                err = errors.get((key, rank), "no output file")
                res = RankResult(rank=rank, trial=key, state="wrong", message=f"unreadable output: {err}")
            elif mac_key is not None and not tensorfile.verify(mac_key, got.structure, got.tensors, got.meta):
                res = RankResult(
                    rank=rank,
                    trial=key,
                    state="wrong",
                    message="its output file was altered after the harness wrote it (a forged result "
                    "file); results are written by the harness only",
                )
            else:
                res = judge.compare(rank, key, got, want, p.bounds)
            if worst is None or RANK_STATE_ORDER.index(res.state) > RANK_STATE_ORDER.index(worst.state):
                worst = res
            if res.state != "pass":
                break
        assert worst is not None
        if worst.state == "pass":
            worst.trial = None
        results.append(worst)
    return results


# What gloo and NCCL say on a rank whose peer died: the failure is a consequence, not a cause.
PEER_LOSS = ("closed by peer", "reset by peer", "remote worker", "communicator was aborted", "Broken pipe")


def _lost_a_peer(r: RankResult) -> bool:
    return r.state == "aborted" or (r.state == "error" and any(m in r.message for m in PEER_LOSS))


def _verdict(ranks: list[RankResult]) -> tuple[str, str]:
    failed = [r for r in ranks if r.state != "pass"]
    if not failed:
        return "pass", ""
    verdict = "timeout" if any(r.state == "timeout" for r in failed) else "fail"
    # the root cause: a rank that failed on its own, before one that only lost a peer; then the earliest
    lead = min(failed, key=lambda r: (_lost_a_peer(r), r.ended_s if r.ended_s is not None else 1e9))
    where = f"rank {lead.rank}" + (f", trial {lead.trial}" if lead.trial is not None else "")
    return verdict, f"{where}: {lead.message}"


def check(
    ref: int | str,
    solution: Path,
    *,
    world_size: int = 4,
    device: str | None = None,
    size: str = "pkb",
    trials: int = 5,
    timeout_s: float = 120.0,
    sandbox: str = "auto",
    progress: Progress = _noop,
    cancel: threading.Event | None = None,
    gpus: list[int] | None = None,
    convention: str = "auto",
) -> CheckResult:
    """Run the candidate on every rank over fresh secret-seeded trials and judge every output."""
    run = _Run(ref, solution, world_size, device, size, timeout_s, sandbox, gpus, convention)
    p = run.problem
    if not 1 <= trials <= MAX_TRIALS:
        raise UserError(f"trials must be between 1 and {MAX_TRIALS}, not {trials}")

    def result(verdict: str, message: str, ranks: list[RankResult]) -> CheckResult:
        return CheckResult(
            problem_id=p.id,
            problem=p.name,
            world_size=world_size,
            size=size,
            device=run.device,
            trials=trials,
            verdict=verdict,
            message=message,
            ranks=ranks,  # type: ignore[arg-type]
            wall_s=run.elapsed(),
            sandbox=run.sandbox,
            warnings=run.warnings,
            notes=run.notes,
            static_report=run.static_report,
        )

    if run.syntax_error:
        ranks = [RankResult(rank=r, state="error", message=run.syntax_error) for r in range(world_size)]
        return result("fail", f"the solution does not parse: {run.syntax_error}", ranks)
    if run.refusal:
        return result("fail", run.refusal, _refused_ranks(run))
    run.prepare_extensions(progress, cancel)
    seeds = [secrets.randbits(62) for _ in range(trials)]
    progress(0, 3, f"running reference and candidate: {trials} trials on {world_size} ranks ({run.device})")
    ref_request = run.request("outputs", p.path, seeds)
    cand_request = run.request("outputs", run.solution, seeds)
    if run.backend.isolated:
        with ThreadPoolExecutor(max_workers=2) as pool:
            ref_future = pool.submit(run_job, ref_request, run.backend, cancel)
            cand_future = pool.submit(run_job, cand_request, run.backend, cancel)
            ref_outcome, cand_outcome = ref_future.result(), cand_future.result()
    else:
        # Without isolation the candidate could read the reference's outputs from its job directory
        # while both run: the reference's job ends (and its directory is gone) before the candidate starts.
        ref_outcome = run_job(ref_request, run.backend, cancel)
        if not ref_outcome.ok:
            raise _reference_failed(p, ref_outcome)
        cand_outcome = run_job(cand_request, run.backend, cancel)
    if not ref_outcome.ok:
        raise _reference_failed(p, ref_outcome)
    run.notes += conventions.notes(cand_outcome)
    progress(2, 3, "judging outputs")
    mac_key = tensorfile.result_key(seeds)
    ranks = _judge(p, world_size, list(range(trials)), cand_outcome, ref_outcome, mac_key)
    verdict, why = _verdict(ranks)
    in_trials = f"{trials} trial" + ("s" if trials != 1 else "")
    message = f"all {world_size} ranks match the reference in {in_trials}" if verdict == "pass" else why
    progress(3, 3, message)
    return result(verdict, message, ranks)


def physical_floor_ms(roof: RooflineResult) -> float:
    """The part of the floor that physics guarantees: bytes over the link and HBM, FLOPs at peak.
    (The latency term is an assumed cost per round, not a bound, so the guard leaves it out.)"""
    return max(roof.nvlink_ms, roof.hbm_ms, roof.compute_ms)


def below_floor(time_ms: float, roof: RooflineResult, slack: float = FLOOR_SLACK) -> bool:
    """Whether a measured time is below what the hardware can do: the speed-of-light guard."""
    return time_ms < slack * physical_floor_ms(roof)


def floor_message(time_ms: float, roof: RooflineResult, speed: float) -> str:
    terms = {"NVLink": roof.nvlink_ms, "HBM": roof.hbm_ms, "compute": roof.compute_ms}
    bound = max(terms, key=lambda k: terms[k])
    return (
        f"not credited: the candidate's median {time_ms:.4g} ms is below the physical floor "
        f"{terms[bound]:.4g} ms (its {bound} traffic at the ceilings of {roof.ceilings.source}); work "
        f"was skipped or hidden from the clock, or the traffic model is wrong (measured {speed:.3f}x "
        "the reference)"
    )


def seen_inputs_message(ref: TimingStats, cand: TimingStats, speed: float, fresh_speed: float | None) -> str:
    """Why a candidate much faster on inputs it has seen is not credited, with the figures."""
    assert cand.replay_advantage is not None and cand.fresh_median_ms is not None
    relative = stats.seen_inputs_advantage(ref, cand)
    on_fresh = f"; on fresh inputs it measured {fresh_speed:.3f}x" if fresh_speed else ""
    return (
        f"not credited: the candidate is {relative:.2f}x faster on input sets it has seen than on fresh "
        f"ones (fresh calls: median {cand.fresh_median_ms:.4g} ms over {cand.fresh_calls}, each "
        f"{cand.replay_advantage:.2f}x its replayed neighbours at the median, sign test p = "
        f"{cand.replay_advantage_p:.2g}): outputs memoized by input values? (measured {speed:.3f}x the "
        f"reference{on_fresh})"
    )


# How each side of a benchmark is sampled (harness/timing.py). On GPUs the L2 is also flushed before
# every timed call (its size is read from the device), so a handful of distinct input sets is enough
# (each one is judged on the host).
GPU_TIMING: dict[str, Any] = {
    "warmup_ms": 200.0,
    "max_warmup": 2000,
    "min_samples": 30,
    "max_samples": 3000,
    "budget_ms": 2000.0,
    "min_span_ms": 500.0,
    "precision": 0.005,
    "max_sets": 8,
    "rotation_bytes": 8 << 30,
    # timed calls on fresh input sets (docs/measurement.md): at least fresh_min before precision may
    # stop a job, at most fresh_max, and no more than fit in fresh_bytes of outputs per rank
    "fresh_min": 8,
    "fresh_max": 24,
    "fresh_bytes": 1 << 30,
}
CPU_TIMING: dict[str, Any] = {
    "warmup_ms": 20.0,
    "max_warmup": 50,
    "min_samples": 10,
    "max_samples": 200,
    "budget_ms": 500.0,
    "min_span_ms": 0.0,
    "precision": 0.01,
    "l2_bytes": 32 << 20,
    "max_sets": 4,
    "rotation_bytes": 1 << 30,
    "fresh_min": 8,
    "fresh_max": 16,
    "fresh_bytes": 128 << 20,
}


def timing_config(device: str) -> dict[str, Any]:
    """How long and how much to sample on this device (a fresh copy)."""
    if device == "cuda":
        import torch

        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))
        return {**GPU_TIMING, "l2_bytes": l2}
    return dict(CPU_TIMING)


def bench(
    ref: int | str,
    solution: Path,
    *,
    world_size: int = 4,
    device: str | None = None,
    size: str = "pkb",
    timeout_s: float = 300.0,
    sandbox: str = "auto",
    progress: Progress = _noop,
    cancel: threading.Event | None = None,
    gpus: list[int] | None = None,
    placements: int = 1,
    jobs: int = 1,
    convention: str = "auto",
) -> BenchResult:
    """Time the reference and the candidate the same way on the same inputs; re-check every timed output.

    `placements` > 1 times each side in that many memory placements within its job, sharing the
    same sampling budget (docs/plan-fidelity.md). `jobs` > 1 times each side in that many separate
    jobs, reference and candidate alternating, which share the budget too: identical code spreads
    more between jobs than within one, and the median of several jobs' medians spreads less. The
    defaults (one of each) are the measured method of docs/gpu-results.md."""
    if not 1 <= placements <= MAX_PLACEMENTS:
        raise UserError(f"placements must be between 1 and {MAX_PLACEMENTS}, not {placements}")
    if not 1 <= jobs <= MAX_JOBS:
        raise UserError(f"jobs must be between 1 and {MAX_JOBS}, not {jobs}")
    run = _Run(ref, solution, world_size, device, size, timeout_s, sandbox, gpus, convention)
    p = run.problem

    def result(verdict: str, message: str, **fields: Any) -> BenchResult:
        return BenchResult(
            problem_id=p.id,
            problem=p.name,
            world_size=world_size,
            size=size,
            device=run.device,
            verdict=verdict,
            message=message,
            wall_s=run.elapsed(),  # type: ignore[arg-type]
            sandbox=run.sandbox,
            warnings=run.warnings,
            notes=run.notes,
            static_report=run.static_report,
            **fields,
        )

    if run.syntax_error:
        ranks = [RankResult(rank=r, state="error", message=run.syntax_error) for r in range(world_size)]
        return result("fail", f"the solution does not parse: {run.syntax_error}", ranks=ranks)
    if run.refusal:
        return result("fail", run.refusal, ranks=_refused_ranks(run))
    run.prepare_extensions(progress, cancel)
    seeds = [secrets.randbits(62)]
    # a side's jobs share its sampling budget the way a job's placements do
    tcfg = {**timing.placement_config(timing_config(run.device), jobs), "placements": placements}
    steps = 2 * jobs + 1
    pool = warm_pool(run.backend)
    ran: list[tuple[JobOutcome, JobOutcome]] = []  # (reference, candidate) of each job, in order
    ref_records: list[dict[str, Any]] = []

    def job_of(job: int) -> str:
        return f" (job {job + 1} of {jobs})" if jobs > 1 else ""

    def job_timing(job: int, reference: bool) -> dict[str, Any]:
        # each job's fresh input sets are its own; the reference's job makes outputs for all of them
        return {**tcfg, "fresh_label": f"job{job}", "fresh_top_up": reference}

    ref_request = run.request("benchmark", p.path, seeds, job_timing(0, True))
    # every job gets a sandbox started ahead: none may start while the other side is timed
    ahead = (
        f"starting a sandbox for each of the {2 * jobs} jobs, then " if pool is not None and jobs > 1 else ""
    )
    progress(0, steps, f"{ahead}timing the reference{job_of(0)}")
    prestart(ref_request, run.backend, 2 * jobs)
    # no sandbox warms up on the GPUs while any of them is timed (this waits for those starting)
    with pool.quiet() if pool is not None else contextlib.nullcontext():
        for job in range(jobs):
            if job:
                progress(2 * job, steps, f"timing the reference{job_of(job)}")
            ref_outcome = run_job(
                run.request("benchmark", p.path, seeds, job_timing(job, True)), run.backend, cancel
            )
            if not ref_outcome.ok or ref_outcome.timing is None:
                raise _reference_failed(p, ref_outcome)
            ref_records.append(ref_outcome.timing)
            so_far = stats.summarize(stats.pool_jobs(ref_records))[0].median_ms
            progress(2 * job + 1, steps, f"reference: {so_far:.4g} ms; timing the candidate{job_of(job)}")
            cand_request = run.request("benchmark", run.solution, seeds, job_timing(job, False))
            cand_outcome = run_job(cand_request, run.backend, cancel)
            ran.append((ref_outcome, cand_outcome))
            if not cand_outcome.ok:
                break  # judged below: the first failure decides
    run.notes += conventions.notes(ran[0][1])
    ref_stats, ref_warnings = stats.summarize(stats.pool_jobs(ref_records))
    run.warnings.extend(f"reference: {w}" for w in ref_warnings)
    fields: dict[str, Any] = {"reference": ref_stats}
    mac_key = tensorfile.result_key(seeds)
    cand_records: list[dict[str, Any]] = []
    for job, (ref_outcome, cand_outcome) in enumerate(ran):
        sets = int(ref_records[job]["input_sets"])
        fields["ranks"] = _judge(p, world_size, list(range(sets)), cand_outcome, ref_outcome, mac_key)
        refused = _refused_timing(fields["ranks"], cand_outcome, mac_key)
        if refused is not None:
            return result(refused[0], refused[1] + job_of(job), **fields)
        assert cand_outcome.timing is not None
        # every timed call on a fresh input set is judged too: right on the replayed sets is not enough
        timed = int(cand_outcome.timing.get("fresh_timed", 0))
        fresh_keys = [int(k) for k in cand_outcome.timing.get("fresh_judged", []) if int(k) < timed]
        if not fresh_keys:  # sampling stopped before any fresh call whose outputs are kept was timed
            run.warnings.append(
                f"no timed call on a fresh input set had its outputs judged{job_of(job)} ({timed} timed)"
            )
            cand_records.append(cand_outcome.timing)
            continue
        fresh_ranks = _judge(p, world_size, fresh_keys, cand_outcome, ref_outcome, mac_key, fresh=True)
        verdict, why = _verdict(fresh_ranks)
        if verdict != "pass":
            fields["ranks"] = fresh_ranks
            return result(
                verdict,
                f"wrong on a fresh input set (a timed call on inputs never seen before; the trial number "
                f"is the fresh call's){job_of(job)}: {why}",
                **fields,
            )
        cand_records.append(cand_outcome.timing)
    cand_stats, warnings = stats.summarize(stats.pool_jobs(cand_records))
    run.warnings.extend(warnings)
    speed, low, high = stats.speedup(ref_stats, cand_stats)
    time_ms = cand_stats.median_ms if run.device == "cuda" else None
    roof = roofline.floor(p.id, p.name, world_size, size, p.traffic(world_size, size), p.dtype, time_ms)
    verdict = "pass"
    message = (
        f"{speed:.3f}x the reference ({low:.3f}-{high:.3f}); candidate {cand_stats.median_ms:.4g} ms, "
        f"reference {ref_stats.median_ms:.4g} ms"
    )
    if placements > 1:
        spreads = [s.placement_spread or 0.0 for s in (cand_stats, ref_stats)]
        message += (
            f"; {placements} memory placements per side, their medians spread "
            f"{spreads[0]:.1%} (candidate) and {spreads[1]:.1%} (reference)"
        )
    if jobs > 1:
        spreads = [s.job_spread or 0.0 for s in (cand_stats, ref_stats)]
        message += (
            f"; {jobs} jobs per side, their medians spread {spreads[0]:.1%} (candidate) and "
            f"{spreads[1]:.1%} (reference)"
        )
    if cand_stats.fresh_median_ms and ref_stats.fresh_median_ms:
        fields["fresh_speedup"] = ref_stats.fresh_median_ms / cand_stats.fresh_median_ms
    fields["seen_inputs_advantage"] = stats.seen_inputs_advantage(ref_stats, cand_stats)
    limit = stats.REPLAY_ADVANTAGE_LIMIT.get(run.device, stats.REPLAY_ADVANTAGE_LIMIT["cpu"])
    if (ref_stats.replay_advantage or 0.0) > limit:
        run.warnings.append(
            f"the reference itself is {ref_stats.replay_advantage:.2f}x faster on replayed input sets "
            "than on fresh ones: the check for memoized outputs is weaker on this problem here"
        )
    if run.device != "cuda":
        roof.note = "timed on CPU: the floor is for GPU ceilings, so no % of floor is given"
    else:
        fields["within_noise"] = stats.within_noise(speed)
        if below_floor(cand_stats.median_ms, roof):
            verdict = "suspect"
            fields["below_floor"] = True
            message = floor_message(cand_stats.median_ms, roof, speed)
        else:
            if fields["within_noise"]:
                message += (
                    f"; identical code lands up to {stats.RUN_TO_RUN_SPREAD:.0%} either way between "
                    "runs, so this is no evidence of a difference"
                )
            if roof.note:
                run.warnings.append(
                    f"candidate time {cand_stats.median_ms:.4g} ms is below the floor "
                    f"{roof.floor_ms:.4g} ms: the measurement is suspect"
                )
    if stats.faster_on_seen_inputs(ref_stats, cand_stats, run.device):
        verdict = "suspect"
        fields["faster_on_seen_inputs"] = True
        message = seen_inputs_message(ref_stats, cand_stats, speed, fields.get("fresh_speedup"))
    progress(steps, steps, f"speedup {speed:.3f}x")
    return result(
        verdict,
        message,
        candidate=cand_stats,
        speedup=speed,
        speedup_low=low,
        speedup_high=high,
        roofline=roof.placement(),
        **fields,
    )
