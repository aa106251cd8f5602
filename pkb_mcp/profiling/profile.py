"""The `profile` verb: where each rank's time goes in one call, reference and candidate side by side.

Runs the reference and the candidate on the same inputs, each in a sandbox launch of mode `profile`
(harness/profile.py: torch.profiler over a few aligned calls after warm-up, then NVML's NVLink counts
of as many more on GPUs), where it can a counter launch of each side too (every rank under Nsight
Compute, one call counted: pkb_mcp/profiling/nvlink.py), reads every rank's files as untrusted input
(pkb_mcp/profiling/traces.py, ncu_csv.py), and returns a compact result: per side and rank the split
of a call into communication, compute, overlap and gaps, launches, waits, the slowest rank, the top
kernels, the NVLink bytes and the kernels that moved them, a few findings; plus the merged Chrome
trace and a PNG timeline in an artifact folder. Every figure is defined in docs/measurement.md
("Profile") and docs/nvlink-counters.md.
"""

from __future__ import annotations

import secrets
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness.contracts import CounterPlan, TimingConfig
from pkb_mcp import config, roofline
from pkb_mcp.launches import LaunchOutcome, run_launch
from pkb_mcp.models import RankResult, Result, RunRequest, SandboxInfo, StaticReport
from pkb_mcp.profiling import nvlink, timeline, traces
from pkb_mcp.profiling.nvlink import Method, NvlinkProfile
from pkb_mcp.runs.benchmark import timing_config
from pkb_mcp.runs.context import DIRECT, JobContext
from pkb_mcp.runs.run import Run, rank_result, reference_failed
from pkb_mcp.runs.verdicts import decide

# All of a profile's launches end within this many times the request's timeout, under the scheduler's
# backstop for a job (pkb_mcp/jobs/scheduler.py: 2.5 times plus a minute): counter launches get what
# the trace launches left, or do not run.
BUDGET_FACTOR = 2.0
MIN_COUNTER_S = 30.0
KEEP_PROFILES = 20  # artifact folders kept in the state directory, newest first
TRACE_FILE = "trace.json"
TIMELINE_FILE = "timeline.png"
# the artifacts of a profile that ran on a cluster node travel as bytes, each at most this long: the
# merged trace's cap with room for its process and thread names, and a generous PNG
ARTIFACT_CAPS = {"trace": traces.MERGED_CAP + (1 << 20), "timeline": 8 << 20}
ARTIFACT_FILES = {"trace": TRACE_FILE, "timeline": TIMELINE_FILE}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- results


class RankProfile(Result):
    # One rank's median call (ms; docs/measurement.md "Profile"). Comments, not a docstring: tools/list.
    rank: int
    call_ms: float = Field(description="window: first work to last work of the call")
    comm_ms: float
    compute_ms: float
    overlap_ms: float = Field(description="communication while compute runs")
    gap_ms: float = Field(description="window with nothing running")
    other_ms: float = 0.0
    wait_ms: float | None = Field(None, description="communication before the last rank joined")
    launches: float = Field(description="device operations (CPU: ops) per call")
    enqueue_ms: float = Field(description="host time inside solution()")


class KernelTime(Result):
    name: str
    category: str
    ms: float = Field(description="per call and rank")
    count: float = Field(description="per call and rank")


class SideProfile(Result):
    calls: int
    call_ms: float = Field(description="median over calls of the slowest rank's window")
    event_ms: float | None = Field(None, description="median device-event time of the calls, as bench")
    comm_ms: float
    compute_ms: float
    overlap_ms: float
    overlap_pct: float | None = Field(None, description="overlap / communication x 100")
    gap_ms: float
    launches: float
    slowest_rank: int | None = None
    others_wait_ms: float | None = None
    slowest_does: str = ""
    ranks: list[RankProfile]
    top: list[KernelTime]
    missing: list[str] = Field(default_factory=list)
    nvlink: NvlinkProfile | None = None


class Artifact(Result):
    path: str
    bytes: int
    events: int = 0
    cut_events: int = 0


class ProfileResult(Result):
    problem_id: int
    problem: str
    world_size: int
    size: str
    device: str
    verdict: Literal["ok", "fail", "timeout"]
    message: str
    reference: SideProfile | None = None
    candidate: SideProfile | None = None
    findings: list[str] = Field(default_factory=list)
    method: Method = Field("names", description="NVLink bytes from ncu, nvml, or none (names)")
    counters: str = Field("", description="what counted NVLink bytes and at what cost, or why nothing did")
    trace: Artifact | None = None
    timeline: Artifact | None = None
    ranks: list[RankResult] = Field([], description="candidate ranks that failed")
    wall_s: float
    sandbox: SandboxInfo
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    static_report: StaticReport | None = None


# ---------------------------------------------------------------- figures -> result


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def rank_profiles(side: traces.SideFigures) -> list[RankProfile]:
    """Each rank's median call (by window), so that its figures add up; waits as a median of all."""
    out = []
    for j, rank in enumerate(side.ranks):
        calls = sorted((c[j] for c in side.calls), key=lambda c: c.window_us)
        waits = [c.wait_us for c in calls if c.wait_us is not None]
        if not calls:
            continue
        m = calls[(len(calls) - 1) // 2]
        out.append(
            RankProfile(
                rank=rank,
                call_ms=_r(m.window_us / 1e3),
                comm_ms=_r(m.comm_us / 1e3),
                compute_ms=_r(m.compute_us / 1e3),
                overlap_ms=_r(m.overlap_us / 1e3),
                gap_ms=_r(m.gap_us / 1e3),
                other_ms=_r(m.other_us / 1e3),
                wait_ms=_r(_median(waits) / 1e3) if len(waits) == len(calls) else None,
                launches=float(m.launches),
                enqueue_ms=_r(m.enqueue_us / 1e3),
            )
        )
    return out


def side_profile(side: traces.SideFigures, bytes_moved: NvlinkProfile | None = None) -> SideProfile:
    ranks = rank_profiles(side)

    def mean(attr: str) -> float:
        return _r(statistics.fmean(getattr(r, attr) for r in ranks)) if ranks else 0.0

    comm, overlap = mean("comm_ms"), mean("overlap_ms")
    slowest, wait_ms, does = traces.slowest_rank(side)
    return SideProfile(
        calls=len(side.calls),
        call_ms=_r(_median([max(r.window_us for r in c) for c in side.calls]) / 1e3),
        event_ms=_r(_median(side.event_ms)) if side.event_ms else None,
        comm_ms=comm,
        compute_ms=mean("compute_ms"),
        overlap_ms=overlap,
        overlap_pct=_r(100 * overlap / comm) if comm > 0 else None,
        gap_ms=mean("gap_ms"),
        launches=mean("launches"),
        slowest_rank=slowest,
        others_wait_ms=_r(wait_ms) if wait_ms is not None else None,
        slowest_does=does,
        ranks=ranks,
        top=[
            KernelTime(name=name[:80], category=cat, ms=_r(us / 1e3), count=_r(n))
            for name, cat, us, n in side.top
        ],
        missing=[f"rank {rank}: {why}" for rank, why in sorted(side.missing.items())],
        nvlink=bytes_moved,
    )


def findings(ref: SideProfile | None, cand: SideProfile | None, device: str) -> list[str]:
    """A few sentences an agent can act on, from the figures (each figure: docs/measurement.md)."""
    out: list[str] = []
    if ref is not None and cand is not None and ref.call_ms > 0 and cand.call_ms > 0:
        change = {
            "exposed communication": (cand.comm_ms - cand.overlap_ms) - (ref.comm_ms - ref.overlap_ms),
            "compute": cand.compute_ms - ref.compute_ms,
            "gaps": cand.gap_ms - ref.gap_ms,
        }
        key = max(change, key=lambda k: abs(change[k]))
        out.append(
            f"candidate call {cand.call_ms:.4g} ms, reference {ref.call_ms:.4g} ms; the largest difference "
            f"per rank: {abs(change[key]):.4g} ms {'more' if change[key] > 0 else 'less'} {key}"
        )
    for label, s, other in (("candidate", cand, ref), ("reference", ref, None)):
        if s is None or s.call_ms <= 0:
            continue
        exposed = max(s.comm_ms - s.overlap_ms, 0.0)
        if s.comm_ms > 0:
            versus = f" (reference: {other.overlap_pct or 0:.0f}%)" if other is not None else ""
            out.append(
                f"{label}: communication {s.comm_ms:.4g} ms per rank and call, {s.overlap_pct or 0:.0f}% "
                f"of it overlapped with compute{versus}; {exposed:.4g} ms of {s.call_ms:.4g} ms exposed"
            )
        if s.gap_ms > 0.2 * s.call_ms:
            where = "the device waited for the host or for events" if device == "cuda" else "no op ran"
            enqueue = statistics.fmean(r.enqueue_ms for r in s.ranks) if s.ranks else 0.0
            bound = (
                f"; the host took {enqueue:.4g} ms to issue {s.launches:g} launches: host-bound"
                if device == "cuda" and enqueue > s.call_ms
                else ""
            )
            out.append(f"{label}: {s.gap_ms:.4g} ms of the call are gaps ({where}){bound}")
        if s.others_wait_ms is not None and s.slowest_rank is not None and s.others_wait_ms > 0.1 * s.call_ms:
            does = f"; {s.slowest_does}" if s.slowest_does else ""
            out.append(
                f"{label}: the other ranks wait {s.others_wait_ms:.4g} ms per call in communication for "
                f"rank {s.slowest_rank}{does}"
            )
    return out


# ---------------------------------------------------------------- artifacts


def profiles_root() -> Path:
    """Where profiles keep their artifacts unless told otherwise: the state directory's profiles/."""
    return config.state_dir() / "profiles"


def artifact_dir(out_dir: Path | None, profiles_dir: Path | None = None) -> Path:
    """Where a profile's trace and timeline go: `out_dir`, or a new folder under `profiles_dir`
    (default `profiles_root()`), of which the newest KEEP_PROFILES are kept."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir
    root = profiles_dir or profiles_root()
    root.mkdir(parents=True, exist_ok=True)
    old = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in old[KEEP_PROFILES - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)
    path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def write_artifacts(
    folder: Path,
    sides: dict[str, list[traces.RankTrace]],
    figures: dict[str, traces.SideFigures],
    measured: Mapping[str, traces.Measured] | None = None,
) -> tuple[Artifact, Artifact | None, str | None]:
    data, events, cut = traces.merged_trace(sides, measured=measured)
    trace_path = folder / TRACE_FILE
    trace_path.write_bytes(data)
    trace = Artifact(path=str(trace_path), bytes=len(data), events=events, cut_events=cut)
    bars: dict[str, tuple[list[traces.Bar], str]] = {}
    for side, f in figures.items():
        if not f.calls:
            continue
        call = f.calls[f.median_call]
        t0 = min(r.window[0] for r in call)
        shifted = [traces.Bar(b.row, b.start - t0, b.end - t0, b.category) for r in call for b in r.bars]
        slowest = max(r.window_us for r in call) / 1e3
        bars[side] = (shifted, f"call {f.median_call + 1} of {len(f.calls)} (median), {slowest:.4g} ms")
    png = folder / TIMELINE_FILE
    why = timeline.draw(bars, png)
    drawn = Artifact(path=str(png), bytes=png.stat().st_size) if why is None and png.is_file() else None
    return trace, drawn, why


# ---------------------------------------------------------------- artifacts from a cluster node


def pack_artifacts(result: dict[str, Any], folder: Path) -> dict[str, bytes | str]:
    """On a cluster node: the bytes of a profile result's trace and timeline, read from `folder` (the
    node-local folder the profile wrote into) at most their cap, to travel with the job's end; for
    one that cannot travel, why not (the server says so in the result)."""
    packed: dict[str, bytes | str] = {}
    for name, cap in ARTIFACT_CAPS.items():
        entry = result.get(name)
        if not isinstance(entry, dict) or not entry.get("path"):
            continue
        path = Path(entry["path"]).resolve()
        if not path.is_relative_to(folder.resolve()):
            packed[name] = "the node wrote it outside the job's folder"
            continue
        try:
            with open(path, "rb") as f:
                data = f.read(cap + 1)
        except OSError as exc:
            packed[name] = f"the node could not read it: {exc.strerror or exc}"
            continue
        packed[name] = data if len(data) <= cap else f"it is over the limit of {cap >> 20} MiB"
    return packed


def _refused(name: str, data: Any) -> str | None:
    """Why a cluster node's bytes for an artifact are not written (None: they are)."""
    if isinstance(data, str):
        return data[:300]  # the node's reason, as data
    if not isinstance(data, bytes):
        return "no bytes came with the job's end"
    if len(data) > ARTIFACT_CAPS[name]:
        return f"{len(data)} bytes, over the limit of {ARTIFACT_CAPS[name]}"
    if name == "timeline" and not data.startswith(PNG_SIGNATURE):
        return "the bytes are not a PNG"
    if name == "trace":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "the bytes are not UTF-8 text"
    return None


def land_artifacts(result: dict[str, Any], packed: Any, profiles_dir: Path | None) -> dict[str, Any]:
    """On the server: a cluster node's profile result (already read through ProfileResult) with the
    bytes that came with it written into a new folder under `profiles_dir` (default `profiles_root()`),
    under the server's own file names, and its artifact paths pointing there. A node path never
    stays in the result: an artifact whose bytes did not come, or are refused, is left out, saying
    why in the result's warnings."""
    packed = packed if isinstance(packed, dict) else {}
    out = dict(result)
    warnings = list(out.get("warnings") or [])
    folder: Path | None = None
    for name, file in ARTIFACT_FILES.items():
        entry = out.get(name)
        if entry is None:
            continue
        why = _refused(name, packed.get(name))
        if why is None:
            try:
                folder = folder or artifact_dir(None, profiles_dir)
                (folder / file).write_bytes(packed[name])
            except OSError as exc:
                why = f"the server could not write it: {exc.strerror or exc}"
        if why is not None:
            out[name] = None
            warnings.append(f"the {name} of the cluster node was left out: {why}")
            continue
        assert folder is not None
        out[name] = {**entry, "path": str(folder / file), "bytes": len(packed[name])}
    out["warnings"] = warnings
    return out


# ---------------------------------------------------------------- the verb


def profile_config(device: str, calls: int) -> TimingConfig:
    """The warm-up of a benchmark, the L2 size to flush, and how many calls to profile."""
    tcfg = timing_config(device)
    cfg = TimingConfig(warmup_ms=tcfg["warmup_ms"], max_warmup=tcfg["max_warmup"], calls=calls)
    if "l2_bytes" in tcfg:
        cfg["l2_bytes"] = tcfg["l2_bytes"]
    return cfg


@dataclass
class Counted:
    """A side's counter launch: what its ranks left (None: none, or it failed), why not, its wall time."""

    ranks: list[nvlink.RankCounters] | None
    why: str
    wall_s: float | None = None


def count_side(
    run: Run,
    path: Path,
    seeds: list[int],
    cfg: TimingConfig,
    plan: CounterPlan,
    cancel: threading.Event | None,
) -> Counted:
    """One side's counter launch (docs/nvlink-counters.md): cold, every rank under its own ncu, one
    call counted, within min(the request's timeout, COUNTER_TIMEOUT_S, what the budget has left)."""
    left = BUDGET_FACTOR * run.timeout_s - run.elapsed()
    if left < MIN_COUNTER_S:
        return Counted(None, f"no time left for a counter launch ({left:.0f} s of the profile's budget)")
    request = run.launch_request("profile", path, seeds, cfg)
    request.settings["counters"] = plan
    request.settings["timeout_s"] = min(run.timeout_s, nvlink.COUNTER_TIMEOUT_S, left)
    request.cold = True
    outcome = run_launch(
        request,
        run.backend,
        cancel,
        collect=lambda d: nvlink.read_counter_launch(d, run.world_size, plan["metrics"]),
    )
    wall = round(outcome.wall_s, 1)
    if not outcome.ok:
        bad = next(r for r in outcome.ranks if r.state != "ok")
        said = [r.error for r in outcome.collected or [] if r.error and "ncu said" in r.error]
        first = bad.error.strip().splitlines()[0][:200] if bad.error.strip() else ""
        if bad.state == "timeout":
            detail = f"it passed its deadline of {request.settings['timeout_s']:g} s"
        elif first:  # the rank's own error is the cause; ncu's "returned an error code" its symptom
            detail = f"rank {bad.rank}: {first}" + (f" ({said[0]})" if said else "")
        else:
            detail = said[0] if said else f"rank {bad.rank}: {bad.state}"
        return Counted(None, f"the counter launch failed: {detail}", wall)
    return Counted(outcome.collected, "", wall)


def _counters_text(sides: dict[str, nvlink.Measurement], counted: dict[str, Counted]) -> str:
    """What counted the NVLink bytes of each side and what it cost, or why nothing did."""
    parts = {}
    for side, m in sides.items():
        p, c = m.profile, counted.get(side)
        if p.method == "ncu" and c is not None:
            passes = f", up to {p.passes} pass(es) a kernel" if p.passes else ""
            parts[side] = (
                f"per kernel from ncu, in a counter launch of {c.wall_s:.3g} s (each rank's kernels of one "
                f"call serialised and counted{passes})"
            )
        elif p.method == "nvml":
            parts[side] = "per call from NVML, kernels by name" + (f" (no ncu: {p.why})" if p.why else "")
        else:
            parts[side] = "not measured, communication by kernel name" + (f": {p.why}" if p.why else "")
    texts = set(parts.values())
    body = texts.pop() if len(texts) == 1 else "; ".join(f"{side}: {t}" for side, t in parts.items())
    tail = "; the timing figures are the unreplayed trace launch's" if counted else ""
    return f"NVLink bytes {body}{tail}"


def profile(request: RunRequest, job: JobContext = DIRECT) -> ProfileResult:
    """Profile the reference and the candidate on the same inputs on every rank (docs/measurement.md,
    "Profile"; the NVLink bytes: docs/nvlink-counters.md).

    The merged trace and the timeline go into `request.out_dir`, or a new folder under
    `request.profiles_dir` (default: the state directory's profiles/)."""
    progress, cancel = job.progress, job.cancel
    calls = request.calls
    run = Run(request)
    world_size = run.world_size
    p = run.problem

    def result(verdict: str, message: str, **fields: Any) -> ProfileResult:
        return ProfileResult(verdict=verdict, message=message, **run.result_fields(), **fields)

    if (cannot := run.cannot_run()) is not None:
        return result("fail", cannot[0], ranks=cannot[1])
    run.prepare_extensions(progress, cancel)
    seeds = [secrets.randbits(62)]  # both sides profile the same inputs
    cfg = profile_config(run.device, calls)
    plan, plan_why = nvlink.plan(run.device, run.backend.isolated)
    steps = 5 if plan is not None else 3

    def launch(path: Path) -> LaunchOutcome:
        return run_launch(
            run.launch_request("profile", path, seeds, cfg),
            run.backend,
            cancel,
            collect=lambda launch_dir: traces.read_launch(launch_dir, world_size),
        )

    progress(0, steps, f"profiling the reference: {calls} calls on {world_size} ranks ({run.device})")
    ref_outcome = launch(p.path)
    if not ref_outcome.ok:
        raise reference_failed(p, ref_outcome, run.timeout_s)
    progress(1, steps, "profiling the candidate")
    cand_outcome = launch(run.solution)
    failed = [rank_result(f, run.sources) for f in cand_outcome.ranks if f.state != "ok"]
    sides = {"candidate": cand_outcome.collected or [], "reference": ref_outcome.collected or []}
    if failed:
        verdict, why = decide(failed)
        ref_figures = traces.analyze(sides["reference"])
        return result(verdict, why, ranks=failed, reference=side_profile(ref_figures))
    counted: dict[str, Counted] = {}
    if plan is not None:
        for i, (side, path) in enumerate((("reference", p.path), ("candidate", run.solution))):
            progress(2 + i, steps, f"counting the {side}'s NVLink bytes under Nsight Compute")
            counted[side] = count_side(run, path, seeds, cfg, plan, cancel)
    progress(steps - 1, steps, "analysing the traces")
    floor_bytes = p.traffic(world_size, run.size).get("nvlink_bytes") if run.device == "cuda" else None
    limits = roofline.ceilings()
    figures: dict[str, traces.SideFigures] = {}
    measured: dict[str, nvlink.Measurement] = {}
    for side, side_traces in sides.items():
        by_name = traces.analyze(side_traces)
        c = counted.get(side, Counted(None, plan_why))
        measured[side] = nvlink.measure(by_name, side_traces, c.ranks, c.why, floor_bytes, limits)
        figures[side] = traces.analyze(side_traces, measured[side].measured)
    ref_side, cand_side = (side_profile(figures[s], measured[s].profile) for s in ("reference", "candidate"))
    folder = artifact_dir(
        Path(request.out_dir) if request.out_dir else None,
        Path(request.profiles_dir) if request.profiles_dir else None,
    )
    categories = {side: m.measured for side, m in measured.items()}
    trace, png, no_png = write_artifacts(folder, sides, figures, categories)
    run.warnings.extend(_warnings(ref_side, cand_side, figures, trace, no_png, run.device))
    message = (
        f"candidate call {cand_side.call_ms:.4g} ms, reference {ref_side.call_ms:.4g} ms (median window of "
        f"the slowest rank over {calls} profiled calls; outputs not judged: use run_correctness)"
    )
    extra = [
        f for side in ("candidate", "reference") for f in nvlink.findings(side, measured[side], figures[side])
    ]
    method = min((m.profile.method for m in measured.values()), key=lambda k: nvlink.METHOD_RANK[k])
    progress(steps, steps, "profiled")
    return result(
        "ok",
        message,
        reference=ref_side,
        candidate=cand_side,
        findings=findings(ref_side, cand_side, run.device) + extra,
        method=method,
        counters=_counters_text(measured, counted),
        trace=trace,
        timeline=png,
    )


def _warnings(
    ref_side: SideProfile,
    cand_side: SideProfile,
    figures: dict[str, traces.SideFigures],
    trace: Artifact,
    no_png: str | None,
    device: str,
) -> list[str]:
    """What a profile's reader must know about its figures: what is missing from them."""
    warnings = [
        f"{side}: {m}" for side, s in (("reference", ref_side), ("candidate", cand_side)) for m in s.missing
    ]
    if no_png:
        warnings.append(no_png)
    if device == "cuda":
        warnings += [
            f"{side}: no device activity was recorded (CUPTI): the figures are host ranges only"
            for side, f in figures.items()
            if f.calls and not f.on_gpu
        ]
    if trace.cut_events:
        warnings.append(
            f"the trace was cut at {traces.MERGED_CAP >> 20} MiB: {trace.cut_events} events left out"
        )
    return warnings
