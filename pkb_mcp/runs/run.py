"""A run: the set-up that check, bench and profile share (the problem, the device and GPUs, the
solution read as text and whether its parameters can take the problem's call (runs/signature.py), its
static report, the sandbox backend, its extensions built), and what a failed rank or a failed
reference says to the user."""

from __future__ import annotations

import ast
import os
import stat
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.contracts import STARTING, LaterTrials, LaunchSettings, TimingConfig
from pkb_mcp import problems, python_text
from pkb_mcp.compile import extensions, failures
from pkb_mcp.errors import UserError
from pkb_mcp.launches import (
    HOST_STAGES,
    LaunchOutcome,
    LaunchRequest,
    RankOutcome,
    ToolLaunches,
    run_launch,
)
from pkb_mcp.models import RankResult, RunRequest, SandboxInfo, StaticReport
from pkb_mcp.runs import conventions, judge, pairing, signature, static_report
from pkb_mcp.runs.context import Progress
from sandbox import SandboxUnavailable, select_backend
from sandbox.backend import Backend

MAX_SOLUTION_BYTES = 1 << 20
BUILD_TIMEOUT_S = 600.0  # discovering and building a solution's extensions before its launches


def check_world_size(p: problems.Problem, world_size: int, size: str) -> None:
    if world_size < 1:
        raise UserError(f"world size {world_size} is not positive; pass --world-size 2 or more")
    reason = p.world_size_error(world_size, size)
    if reason:
        raise UserError(
            f"problem {p.id} ({p.name}) cannot run at world size {world_size} with size {size!r}: "
            f"{reason} (rule: {p.world_sizes})"
        )


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gpus_for(device: str, world_size: int) -> list[int]:
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


def path_error(path: Path, suffixes: tuple[str, ...] = (".py",)) -> str | None:
    """What is wrong with a candidate's path (a directory, missing, not a .py file), or None."""
    if path.is_dir():
        return f"{path} is a directory, not a {' or '.join(suffixes)} file"
    if not path.is_file():
        return f"{path} does not exist"
    if path.suffix not in suffixes:
        return f"{path} is not a {' or '.join(suffixes)} file"
    return None


def read_confined(
    path: str, roots: Sequence[Path], suffixes: tuple[str, ...], limit: int
) -> tuple[str, bytes]:
    """A file that a remote client named, read once: its name and bytes. Every refusal (missing,
    outside `roots`, not a regular file, another suffix, unreadable) is one UserError, the same
    sentence whatever the reason, so that no answer tells what exists on the machine. The path is
    resolved (links followed, `..` collapsed) before it is compared with the roots; the file is then
    opened without following a link and without blocking (a FIFO), and the path of what was opened
    compared again, so that a link swapped in meanwhile cannot lead out of the roots."""
    kinds = ", ".join(suffixes[:-1]) + " or " + suffixes[-1] if len(suffixes) > 1 else suffixes[0]
    refusal = UserError(
        f"path is not a readable {kinds} file under the server's roots ({', '.join(map(str, roots))}); "
        "send the code as source instead, or have the server started with --root DIR (or PKB_ROOTS)"
    )
    try:
        file = Path(os.path.realpath(Path(path).expanduser()))
    except (OSError, RuntimeError, ValueError):  # no home folder for ~, a NUL byte
        raise refusal from None
    if file.suffix not in suffixes or not any(file.is_relative_to(root) for root in roots):
        raise refusal
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        raise refusal from None
    try:
        opened = Path(f"/proc/self/fd/{fd}")
        if not stat.S_ISREG(os.fstat(fd).st_mode) or (opened.exists() and opened.readlink() != file):
            raise refusal
        size = os.fstat(fd).st_size
        if size > limit:
            raise UserError(f"{file.name} is {size} bytes, over the limit of {limit}; send a smaller file")
        chunks: list[bytes] = []
        while (got := sum(map(len, chunks))) <= limit and (chunk := os.read(fd, limit + 1 - got)):
            chunks.append(chunk)
    except OSError:
        raise refusal from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grown since its size was read
        raise UserError(f"{file.name} is over the limit of {limit} bytes; send a smaller file")
    return file.name, data


def read_solution(path: Path) -> str | None:
    """Validates the solution file as text (it is never imported here): raises UserError for a path that
    is not a usable .py file; returns why the candidate cannot run (it does not parse, or defines no
    solution) as a candidate failure, or None."""
    if (wrong := path_error(path)) is not None:
        raise UserError(f"{wrong}; pass the path of a .py file defining solution()")
    size = path.stat().st_size
    if size == 0:
        raise UserError(
            f"solution file {path} is empty; it must define solution() with the reference's signature"
        )
    if size > MAX_SOLUTION_BYTES:
        raise UserError(f"solution file {path} is {size} bytes, over the {MAX_SOLUTION_BYTES}-byte limit")
    try:
        tree = python_text.parse(path.read_bytes(), filename=path.name)
    except SyntaxError as exc:
        return f"the solution does not parse: {path.name}:{exc.lineno}: {exc.msg}"
    except ValueError as exc:
        return f"the solution does not parse: {path.name}: {exc}"
    if not _may_define_solution(tree):
        return (
            f"{path.name} defines no solution(): a candidate is a module whose solution(...) takes the "
            "reference's inputs (pkb show ID prints the signature)"
        )
    return None


def unrunnable(
    problem: problems.Problem, path: Path, world_size: int, size: str, convention: str = "auto"
) -> str | None:
    """Why a solution file cannot run at all, read as text (it is never imported): it does not parse,
    defines no solution(), or no call the problem makes can bind its solution() (runs/signature.py);
    None when its text allows a run. A path that is no usable .py file raises UserError."""
    if (why := read_solution(path)) is not None:
        return why
    try:
        tree = python_text.parse(path.read_bytes(), filename=path.name)
    except (SyntaxError, ValueError):
        return None
    return signature.mismatch(problem, tree, world_size, size, conventions.requested(convention))


def refuse_unrunnable(
    problem: problems.Problem, path: Path, world_size: int, size: str, convention: str = "auto"
) -> None:
    """A file that cannot run is bad input, refused before any launch in one sentence."""
    if (why := unrunnable(problem, path, world_size, size, convention)) is not None:
        raise UserError(why)


def _may_define_solution(tree: ast.Module) -> bool:
    """Whether the module's top level could bind `solution` (a def, an assignment, an import, or
    something too dynamic to tell: a star import, globals())."""
    for node in ast.walk(tree):
        named = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        if named == "solution":
            return True
        if isinstance(node, ast.Name) and node.id in ("solution", "globals", "exec", "setattr"):
            return True
        if isinstance(node, ast.alias) and (node.name == "*" or (node.asname or node.name) == "solution"):
            return True
    return False


def preflight(
    ref: int | str,
    world_size: int,
    size: str,
    device: str | None,
    local_gpus: bool = True,
    variant: str = "pkb",
) -> tuple[problems.Problem, str]:
    """Everything about a run request that can be refused before any work starts. `local_gpus`:
    whether the run will hold this machine's GPUs (not so where a cluster's nodes run it)."""
    problem = problems.resolve(ref, variant)
    check_world_size(problem, world_size, size)
    device = device or default_device()
    if local_gpus:
        gpus_for(device, world_size)
    return problem, device


LEAN_NOTE = (
    "lean inputs (the problem's LEAN_INPUTS): no input is copied; unchanged inputs are judged by keyed "
    "fingerprints, and a benchmark replays one input set, unrotated, with no separate fresh buffers "
    "(docs/problem-format.md)"
)


class Run:
    """What check, bench and profile share for one request: the problem, its size and device, the GPUs,
    the solution read as text, the sandbox backend."""

    def __init__(self, request: RunRequest):
        self.t0 = time.monotonic()
        self.request = request
        self.convention = conventions.requested(request.convention)
        world_size = request.world_size
        # a file named after a problem runs against it, whatever id was given (runs/pairing.py)
        problem_ref, paired_note = pairing.for_request(request.problem, request.path)
        self.problem, self.device = preflight(
            problem_ref, world_size, request.size, request.device, variant=request.variant
        )
        gpus = request.gpus
        self.gpus = gpus if gpus is not None and self.device == "cuda" else gpus_for(self.device, world_size)
        self.world_size = world_size
        self.size = request.size
        self.timeout_s = request.timeout_s
        self.solution = Path(request.path).resolve()
        refuse_unrunnable(self.problem, self.solution, world_size, self.size, self.convention)
        # what the source still calls, read without running it; multicast refuses it outright
        self.static_report: StaticReport | None = None
        self.refusal: str | None = None
        try:
            self.static_report = static_report.analyze(self.solution.read_bytes(), self.solution.name)
            self.refusal = static_report.refusal(self.static_report)
        except (SyntaxError, ValueError, RecursionError):
            self.static_report = None
        try:
            self.backend: Backend = select_backend(request.sandbox)
        except SandboxUnavailable as exc:
            raise UserError(str(exc)) from exc
        self.sandbox = SandboxInfo(
            backend=self.backend.name, isolated=self.backend.isolated, note=self.backend.note
        )
        self.warnings = [] if self.backend.isolated else [self.backend.note]
        # what a failed build's message is mapped back to (prepare_extensions adds the builds)
        self.sources = failures.SolutionSources(self.solution.name, self._text())
        self.notes: list[str] = [paired_note] if paired_note else []
        if self.problem.lean_inputs:
            self.notes.append(LEAN_NOTE)
        if self.problem.variant != "pkb":
            self.notes.append(
                f"the {self.problem.variant} variant: the original benchmark's workload, its inputs and "
                "tolerance (docs/variants.md)"
            )

    def prepare_extensions(self, progress: Progress, cancel: threading.Event | None) -> None:
        """Build the solution's load_inline extensions into the node's cache before its launches run
        (pkb_mcp/compile/extensions.py); a solution without any costs nothing here."""
        from pkb_mcp.compile import extensions

        text = self.sources.text
        if not extensions.may_build(text):
            return
        progress(0, 3, "finding and building the solution's extensions")
        prepared = extensions.prepare(text, ToolLaunches(self.backend, cancel), BUILD_TIMEOUT_S)
        self.notes += prepared.notes()
        self.sources.builds, self.sources.logs = prepared.requests, prepared.logs

    def _text(self) -> str:
        try:
            return self.solution.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def launch_request(
        self,
        mode: str,
        solution: Path,
        seeds: list[int],
        timing: TimingConfig | None = None,
        *,
        size: dict[str, Any] | None = None,
        world_size: int | None = None,
        later: list[LaterTrials] | None = None,
    ) -> LaunchRequest:
        """A launch of the run's problem: at the run's size preset and world size, unless `size` (the
        values themselves) and `world_size` (at most the run's: the GPUs it holds) say otherwise; a
        reference's launch runs the `later` groups of trials after its own (contracts.LaterTrials)."""
        import os

        world_size = world_size or self.world_size
        assert world_size <= self.world_size, "a run holds GPUs for its own world size only"
        threads = 1 if self.device == "cuda" else max(1, (os.cpu_count() or 1) // world_size)
        settings: LaunchSettings = {
            "mode": mode,
            "world_size": world_size,
            "device": self.device,
            "size": size if size is not None else self.problem.size(self.size),
            "dtype": self.problem.dtype,
            "seeds": seeds,
            "tolerance": self.problem.bounds,
            "timeout_s": self.timeout_s,
            "timing": timing,
            "threads_per_rank": threads,
            "convention": self.convention,
        }
        if later is not None:
            assert solution == self.problem.path and mode == "outputs", "the reference's trials only"
            settings["later"] = later
        gpus = self.gpus[:world_size]
        request = LaunchRequest(settings, self.problem.path, solution, gpus, self.problem.max_outputs)
        if solution == self.problem.path:  # a candidate's is cut to its expected outputs (judge.expecting)
            request.read_budget = judge.reference_budget()
        else:  # the candidate is shown its own extensions' cache entries, no one else's
            chain = extensions.toolchain()
            request.extensions = tuple(r.key(chain) for r in self.sources.builds)
        return request

    def run_one(self, request: LaunchRequest, cancel: threading.Event | None) -> LaunchOutcome:
        """One launch in the run's backend (launches.run_launch)."""
        return run_launch(request, self.backend, cancel)

    def launch_pair(
        self, ref_request: LaunchRequest, cand_request: LaunchRequest, cancel: threading.Event | None
    ) -> tuple[LaunchOutcome, LaunchOutcome | None]:
        """The reference's launch and the candidate's, side by side where the sandbox isolates them.
        Without isolation the candidate could read the reference's outputs from its launch directory
        while both run: the reference's launch ends (and its directory is gone) before the candidate
        starts, and a failed reference leaves the candidate unlaunched (None). The candidate's
        outputs are expected to be the reference's in structure, count, dtypes and shapes, checked
        from their files' headers before their data (judge.expecting)."""
        if self.backend.isolated:
            with ThreadPoolExecutor(max_workers=2) as pool:
                ref_future = pool.submit(self.run_one, ref_request, cancel)
                cand_request = judge.expecting_later(cand_request, ref_future.result)
                cand_future = pool.submit(self.run_one, cand_request, cancel)
                return ref_future.result(), cand_future.result()
        ref_outcome = self.run_one(ref_request, cancel)
        if not ref_outcome.ok:
            return ref_outcome, None
        return ref_outcome, self.run_one(judge.expecting(cand_request, ref_outcome), cancel)

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def result_fields(self) -> dict[str, Any]:
        """What every result of a run carries besides its verdict: the problem, the run's shape, its
        wall time so far, the sandbox, and the warnings and notes gathered."""
        return {
            "problem_id": self.problem.id,
            "problem": self.problem.name,
            "world_size": self.world_size,
            "size": self.size,
            "device": self.device,
            "wall_s": self.elapsed(),
            "sandbox": self.sandbox,
            "warnings": self.warnings,
            "notes": self.notes,
            "static_report": self.static_report,
        }

    def cannot_run(self) -> tuple[str, list[RankResult]] | None:
        """Why the solution's source is refused (it calls what pkb does not allow), with every rank's
        result for it; None when it may run. (A file that cannot run at all was refused before:
        refuse_unrunnable.)"""
        if not self.refusal:
            return None
        each = "not run: " + self.refusal
        return self.refusal, [RankResult(rank=r, state="error", message=each) for r in range(self.world_size)]


TIMED_OUT = "still running at the deadline (deadlock or too slow); killed"
# the launcher saw the rank end at the deadline before it had joined its process group (harness/launch.py)
NOT_STARTED = (
    "the deadline passed while this rank was still starting (its interpreter, torch and process "
    "group), before the solution was imported: the time limit is too short for this machine; raise it"
)


def rank_result(rank_outcome: RankOutcome, sources: failures.SolutionSources | None = None) -> RankResult:
    """A rank's result from how it ended; a failed build's message leads with the compiler's first
    errors, at the solution's lines where `sources` finds them (pkb_mcp/compile/failures.py)."""
    error = rank_outcome.error.strip().splitlines()[0][:300] if rank_outcome.error.strip() else ""
    raised = f"raised {error}" + (f" during {rank_outcome.stage}" if rank_outcome.stage else "")
    if rank_outcome.stage in HOST_STAGES:  # the host's own sentence about the launch, as it is
        raised = error
    if rank_outcome.state == "error":
        text = f"{rank_outcome.error}\n{rank_outcome.traceback}"
        raised = failures.build_failure(text, sources) or raised
    messages = {
        "error": raised,
        "crashed": f"crashed ({rank_outcome.signal or error or 'no status'})",
        "timeout": NOT_STARTED if rank_outcome.stage == STARTING else TIMED_OUT,
        "aborted": "killed after another rank failed (it was likely waiting in a collective)",
        "exited": "exited with status 0 before finishing the launch",
    }
    return RankResult(
        rank=rank_outcome.rank,
        state=rank_outcome.state,
        message=messages.get(rank_outcome.state, rank_outcome.state),  # type: ignore[arg-type]
        traceback=rank_outcome.traceback or None,
        log_tail=rank_outcome.log_tail[-2000:] or None,
        ended_s=rank_outcome.ended_s or None,
    )


def reference_failed(
    p: problems.Problem, outcome: LaunchOutcome, timeout_s: float | None = None
) -> UserError:
    """Why the reference's launch gave nothing to judge against, in one sentence: a deadline is a
    timeout (the limit, and whether its ranks had even started), anything else the environment's."""
    bad = next((r for r in outcome.ranks if r.state != "ok"), None)
    if bad is None:
        return UserError(
            f"the reference of problem {p.id} left no record to judge against; the environment failed"
        )
    if outcome.timed_out or bad.state == "timeout":
        limit = f" within its {timeout_s:g} s limit" if timeout_s else " before its deadline"
        starting = any(r.stage == STARTING for r in outcome.ranks)
        why = (
            " (its ranks were still starting: the interpreter, torch, the process group)" if starting else ""
        )
        return UserError(
            f"timeout: the reference of problem {p.id} did not finish{limit}{why}, so nothing was judged; "
            "the time limit is too short for this machine: raise it"
        )
    detail = bad.error or bad.state
    return UserError(
        f"the reference of problem {p.id} failed on rank {bad.rank} ({detail}); the environment "
        f"cannot run this problem here: check the device and world size. Log: {bad.log_tail[-400:]}"
    )
