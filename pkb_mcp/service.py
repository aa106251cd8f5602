"""The service layer: one function per verb, shared by the CLI and the MCP server, and `VERBS`, the
table of the verbs that run as jobs, which the server, the CLI, the scheduler and a cluster read.

Each function validates its input (raising UserError with one actionable sentence), runs the
needed launches through a sandbox backend, judges on the host and returns a model from pkb_mcp.models.
A run verb (compile, check, bench, profile) takes one `RunRequest` whole and its job's context
(pkb_mcp/runs/context.py: progress, cancel, the GPUs to give back). The problems' catalogue is here; a
run's set-up is pkb_mcp/runs/run.py, the check pkb_mcp/runs/check.py, judging pkb_mcp/runs/verdicts.py,
the benchmark pkb_mcp/runs/benchmark.py, the profile pkb_mcp/profiling/profile.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from pkb_mcp import catalogue, config, problems, render, roofline
from pkb_mcp.catalogue import list_problems  # the suite read as text: listing it imports no problem
from pkb_mcp.compile import CompileError, CompileResult, extensions
from pkb_mcp.compile import compile_file as build_file
from pkb_mcp.errors import UserError
from pkb_mcp.launches import ToolLaunches
from pkb_mcp.models import (
    BenchResult,
    Calibration,
    CheckResult,
    InputSpec,
    Kind,
    ProblemDetail,
    ProblemPage,
    ProblemRow,
    RooflineResult,
    RunRequest,
    Traffic,
)
from pkb_mcp.profiling import text as profile_text
from pkb_mcp.profiling.profile import ProfileResult, profile
from pkb_mcp.runs import conventions
from pkb_mcp.runs.benchmark import bench, timing_config
from pkb_mcp.runs.check import check
from pkb_mcp.runs.context import DIRECT, JobContext, Progress, no_progress
from pkb_mcp.runs.run import Run, check_world_size, default_device, preflight
from sandbox import SandboxUnavailable, select_backend

__all__ = [
    "DIRECT",
    "VERBS",
    "JobContext",
    "Progress",
    "bench",
    "calibrate",
    "check",
    "compile_file",
    "default_device",
    "list_problems",
    "needs_build",
    "prebuild",
    "preflight",
    "problem_page",
    "profile",
    "roofline_of",
    "show_problem",
    "timing_config",
]

PAGE_LIMIT = 100  # problems a page of list_problems holds at most (the whole suite, in short rows)


# ---------------------------------------------------------------- problems


def problem_page(
    category: str | None = None,
    text: str | None = None,
    offset: int = 0,
    limit: int = PAGE_LIMIT,
    detail: bool = False,
) -> ProblemPage:
    """A page of `list_problems`, in short rows (id, name, category, summary) unless `detail` adds
    the source, dtype and world-size rule: what a tool result holds without growing with the suite."""
    if offset < 0:
        raise UserError(f"offset {offset} is negative; the first problem is at offset 0")
    if not 1 <= limit <= PAGE_LIMIT:
        raise UserError(f"limit must be between 1 and {PAGE_LIMIT}, not {limit}")
    found = list_problems(category, text)
    shown = ("id", "name", "category", "summary", *(("source", "dtype", "world_sizes") if detail else ()))
    rows = [ProblemRow(**s.model_dump(include=set(shown))) for s in found[offset : offset + limit]]
    end = offset + len(rows)
    return ProblemPage(
        problems=rows, total=len(found), offset=offset, next_offset=end if end < len(found) else None
    )


def show_problem(
    ref: int | str, world_size: int = 4, size: str = "pkb", variant: str = "pkb"
) -> ProblemDetail:
    p = problems.resolve(ref, variant)
    check_world_size(p, world_size, size)
    t = p.traffic(world_size, size)
    return ProblemDetail(
        **catalogue.summary(p).model_dump(),
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
        floor=roofline.floor(p.id, p.name, world_size, size, t, p.dtype).binding(),
        minor_exchange=p.minor_exchange,
        reference_source=p.path.read_text(),
        variant=p.variant,
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
    ref: int | str, world_size: int = 4, size: str = "pkb", time_ms: float | None = None, variant: str = "pkb"
) -> RooflineResult:
    p = problems.resolve(ref, variant)
    check_world_size(p, world_size, size)
    if time_ms is not None and time_ms <= 0:
        raise UserError(f"time {time_ms} ms is not positive; pass --time-ms with a measured time")
    return roofline.floor(p.id, p.name, world_size, size, p.traffic(world_size, size), p.dtype, time_ms)


# ---------------------------------------------------------------- compile


def compile_file(request: RunRequest, job: JobContext = DIRECT) -> CompileResult:
    """Build a .cu file or a solution's extensions (`request.path`): every import and compiler run is a
    sandbox launch."""
    progress, cancel = job.progress, job.cancel
    try:
        backend = select_backend(request.sandbox)
    except SandboxUnavailable as exc:
        raise UserError(str(exc)) from exc
    progress(0, 1, "compiling")
    try:
        result = build_file(
            Path(request.path), cache_dir=config.cache_dir() / "compile", tools=ToolLaunches(backend, cancel)
        )
    except CompileError as exc:
        raise UserError(str(exc)) from exc
    progress(1, 1, "compiled" if result.ok else "compile failed")
    notes = [] if backend.isolated else [backend.note]
    return result.model_copy(update={"sandbox": backend.name, "notes": [*notes, *result.notes]})


def needs_build(text: str) -> bool:
    """Whether a solution's text could build load_inline extensions not yet in the node's cache (a
    batch prebuilds those; a benchmark after its file's check finds them built)."""
    return extensions.may_build(text) and not extensions.built_already(text)


def prebuild(request: RunRequest, job: JobContext = DIRECT) -> list[str]:
    """Build a solution's load_inline extensions into the node's cache (discovery and build launches, no
    GPU), so that its check, queued after, finds them built; what preparing did, as notes."""
    run = Run(request)
    run.prepare_extensions(no_progress, job.cancel)
    return run.notes


# ---------------------------------------------------------------- the verbs that run as jobs


@dataclass(frozen=True)
class Verb:
    """A kind of job, one record: what runs it and what it holds (the scheduler, a cluster), its names
    and its result as the front ends show it. The MCP tools, their output models, task support and order
    (frontends/server.py, tasks.py, surface.py) and the CLI's commands (frontends/cli.py) are read from
    these rows; adding a verb is its module, its row, a `Kind` and the contract snapshot."""

    run: Callable[[RunRequest, JobContext], BaseModel]
    result: type[BaseModel]  # the model of what `run` returns (and a stored job's result)
    tool: str  # its MCP tool
    command: str  # its CLI command (pkb COMMAND)
    text: Callable[[Any, str | None], str]  # the result as text; the str: its job's resource URI, if any
    timeout_s: float = 300.0  # each launch's limit unless the caller gives one
    gpus: bool = True  # holds GPUs on a cuda device (compile: a compile slot of the server)
    whole_node: bool = False  # holds every GPU of its node, so nothing shares NVLink, HBM or power
    remote: bool = True  # runs on a Ray cluster's nodes when there is one (compile stays on the server)


def _profile_text(result: ProfileResult, uri: str | None) -> str:
    """A profile as text; its trace and timeline named by the job's resource URIs, else by their paths."""
    if uri is None:
        return profile_text.profile(result)
    return profile_text.profile(result, f"{uri}/trace", f"{uri}/timeline")


VERBS: dict[str, Verb] = {  # by Kind, in the order an agent works
    "compile": Verb(
        compile_file,
        CompileResult,
        "compile_kernel",
        "compile",
        lambda r, _: r.summary(),
        gpus=False,
        remote=False,
    ),
    "check": Verb(check, CheckResult, "run_correctness", "check", lambda r, _: render.check(r), 120.0),
    "bench": Verb(bench, BenchResult, "benchmark", "bench", lambda r, _: render.bench(r), whole_node=True),
    "profile": Verb(profile, ProfileResult, "profile", "profile", _profile_text, whole_node=True),
}


def _verbs_agree() -> None:
    """At import: the rows are the Kinds, and no two share a tool or a command."""
    if list(VERBS) != list(get_args(Kind)):
        raise RuntimeError(f"service.VERBS {list(VERBS)} and models.Kind {get_args(Kind)} disagree")
    for names in ([v.tool for v in VERBS.values()], [v.command for v in VERBS.values()]):
        if len(set(names)) != len(names):
            raise RuntimeError(f"two verbs share a name: {names}")


_verbs_agree()
