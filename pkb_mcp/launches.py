"""One launch end to end: make the launch dir, run the harness in a sandbox, collect what it left, clean up.

The launch directory holds copies of the problem and solution files (so the sandbox sees nothing else of
the host's), the launcher's and each rank's logs, outputs and timings. Everything read back is capped
and parsed without trusting it; the directory is removed before this returns.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from harness import structure as output_structure
from harness import tensorfile
from harness.contracts import (
    STARTING,
    ConventionRecord,
    LaunchConfig,
    LaunchRecord,
    LaunchSettings,
    RankRecord,
    TimingRecord,
    ToolRecord,
)
from pkb_mcp import config
from pkb_mcp.errors import Cancelled
from pkb_mcp.extension_view import extension_entries, show_entries, use_extension_cache
from pkb_mcp.log import get
from sandbox import cpus
from sandbox.backend import Backend
from sandbox.base import SandboxLaunch
from sandbox.pool import WarmKey, WarmPool, WarmSlot
from sandbox.untrusted import LaunchFiles, typed

if TYPE_CHECKING:
    import torch

log = get(__name__)

OUTPUT_FILE_CAP = 8 << 30
RANK_LOG_CAP = 8 * 1024
OUTPUT_NAME = re.compile(r"^([tsf])(\d+)_r(\d+)\.pkbt$")
# a rank's stage where the host, not the rank, ended it: a limit of the node's that the launch went
# past (sandbox.base.DiskGuard), or what the launch left that the host would not read
LIMIT_STAGE, COLLECT_STAGE = "limit", "collect"
HOST_STAGES = (LIMIT_STAGE, COLLECT_STAGE)


@dataclass
class Outputs:
    """One rank's outputs of one trial (or input set), as its launch wrote them: how they nest
    (`structure`), the tensors, and what the tensor file says of them (`meta`)."""

    structure: output_structure.Structure
    tensors: list[torch.Tensor]
    meta: dict

    def tree(self) -> list:
        """The structure as a tree (harness/structure.py), "tensor" and "tuple" expanded."""
        return output_structure.tree(self.structure, len(self.tensors))

    def tensor_names(self) -> list[str]:
        """Each tensor's place in the output, as a message names it ("output 2['values']")."""
        return output_structure.tensor_names(self.tree())

    def flagged(self, key: str) -> str | None:
        """The first entry of a flag list in `meta` ("aliased_outputs": output indices;
        "mutated_inputs": input names, or indices from older files), in bounded words; None when
        the list is empty or absent."""
        found = self.meta.get(key)
        if not isinstance(found, list) or not found:
            return None
        first = found[0]
        if key == "aliased_outputs":
            return f"output {first}"[:200] if type(first) is int else "an output"
        return f"input {first}" if type(first) is int else str(first)[:200]


@dataclass
class RankOutcome:
    rank: int
    state: str  # ok, error, crashed, timeout, aborted, exited
    error: str = ""
    stage: str = ""
    traceback: str = ""
    signal: str | None = None
    log_tail: str = ""
    ended_s: float = 0.0  # when the launcher saw it end: the first failure is usually the cause
    cpus: list[int] = field(default_factory=list)  # the CPUs it could run on (sandbox/cpus.py); [] unknown
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage of the launch, as reported
    startup: dict[str, float] = field(default_factory=dict)  # a cold rank's start, as reported (RankRecord)


@dataclass
class LaunchOutcome:
    ranks: list[RankOutcome]
    wall_s: float
    timed_out: bool
    outputs: dict[tuple[int, int], Outputs] = field(default_factory=dict)  # (trial or set, rank)
    output_errors: dict[tuple[int, int], str] = field(default_factory=dict)
    # benchmarks: the outputs of the timed calls on fresh input sets, (fresh call, rank)
    fresh_outputs: dict[tuple[int, int], Outputs] = field(default_factory=dict)
    fresh_output_errors: dict[tuple[int, int], str] = field(default_factory=dict)
    timing: TimingRecord | None = None
    launcher_log: str = ""
    # what the host refused to read from the launch directory (sandbox/untrusted.py), one sentence
    # each: a launch that left any such thing failed, whatever its ranks said
    refused: list[str] = field(default_factory=list)
    warm: bool = False  # ran in a sandbox started ahead of need
    collected: Any = None  # what run_launch's `collect` read from the launch directory before its removal
    convention: dict[str, str] | None = None  # what rank 0 recorded it chose (informational)

    @property
    def ok(self) -> bool:
        return not self.refused and all(r.state == "ok" for r in self.ranks)


@dataclass
class LaunchRequest:
    """One launch as a run asks for it: the settings the launcher gets (harness/contracts.py), the
    files to copy into the launch directory, and the GPUs it holds."""

    settings: LaunchSettings
    problem_path: Path
    solution_path: Path
    gpus: list[int]
    max_outputs: int = tensorfile.MAX_TENSORS  # tensors a result file may hold (the problem's MAX_OUTPUTS)
    cold: bool = False  # never a warm sandbox: its ranks must start under a tool (a counter launch)
    # its record may come before its sandbox's end, as a check's launch's does: a benchmark's last
    # launch (the next benchmark waits for that end first: timing_window)
    ends_early: bool = False
    # bytes the host reads of this launch at most, all its files together (sandbox/untrusted.py)
    read_budget: int = 8 << 30
    # the extension cache's keys this launch may load (its solution's load_inline requests,
    # harness/extensions.py Request.key): only these entries are put into its view (show_entries)
    extensions: tuple[str, ...] = ()
    # the output files it must leave, by name, and what each holds (the reference's outputs of the
    # same trials): asked for once the launch has ended, before its outputs are read (it may wait for
    # the reference's launch to be collected); None, or None returned: nothing is expected
    expected: Callable[[], dict[str, tensorfile.Expected] | None] | None = None


_MADE: set[Path] = set()  # the launch directories this process made (end_launches removes what is left)
_MADE_LOCK = threading.Lock()


def new_launch_dir(launch_id: str) -> Path:
    launch_dir = Path(tempfile.mkdtemp(prefix=f"pkb-launch-{launch_id}-", dir=config.launches_dir()))
    os.chmod(launch_dir, 0o755)
    with _MADE_LOCK:
        if len(_MADE) > 1024:  # a long-lived server: forget those already gone
            _MADE.difference_update([d for d in _MADE if not d.exists()])
        _MADE.add(launch_dir)
    return launch_dir


def end_launches(backend: Backend, timeout_s: float) -> int:
    """Everything of this process's launches ended (a server stopping): every sandbox it started
    (Backend.end_all), then every launch directory it made that is still there. The sandboxes
    it ended."""
    ended = backend.end_all(timeout_s)
    with _MADE_LOCK:
        left = list(_MADE)
        _MADE.clear()
    for launch_dir in left:
        shutil.rmtree(launch_dir, ignore_errors=True)
    return ended


# a tool launch's shape (harness/launch.py `_warm_tool`): no GPU, no ranks, every core of the node
TOOL_SHAPE = WarmKey(device="cpu", gpus=(), world_size=0, threads=max(1, os.cpu_count() or 1))
TOOL_SANDBOXES = 1  # kept warm: builds come one at a time while an agent iterates


def enable_warm_pool(backend: Backend, first: WarmKey | None = None, batch: bool = False) -> WarmPool | None:
    """Start sandboxes ahead of need for this backend (a long-running server or a batch wants this; a
    one-shot CLI command does not), the shape `first` at once when given; a `batch`, whose jobs follow
    each other, keeps spares (config.warm_spare). None when the backend cannot."""
    use_extension_cache(backend)
    pool = backend.enable_pool(
        new_launch_dir,
        config.HARNESS_ROOT,
        lambda key: config.warm_per_shape(key.device) if key.world_size else TOOL_SANDBOXES,
        lambda key: config.warm_spare(key.device, batch),
    )
    if pool is not None and first is not None:
        pool.replenish(first)
    if pool is not None and backend.isolated:
        pool.replenish(TOOL_SHAPE)  # the first build finds torch imported too
    return pool


@contextlib.contextmanager
def kept_warm(backend: Backend, first: WarmKey | None = None) -> Iterator[None]:
    """Sandboxes started ahead of need while the block runs (a batch), stopped when it ends however it
    ends; a backend that keeps a pool already (its owner's) or cannot keep one is left as it is."""
    if warm_pool(backend) is not None or enable_warm_pool(backend, first, batch=True) is None:
        yield
        return
    try:
        yield
    finally:
        backend.disable_pool()


def warm_pool(backend: Backend) -> WarmPool | None:
    return backend.pool


def settle_ended(backend: Backend) -> None:
    """Return once the sandboxes of launches that ended cleanly (`ended_cleanly`) have ended too, where
    the backend ends them in the background: a benchmark must have the node to itself."""
    backend.settle_ended()


@cache
def _node_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def warm_key(device: str, gpus: list[int], world_size: int, threads: int) -> WarmKey:
    """The shape of a launch's sandbox, its ranks' CPU cores included (PKB_PIN_CPUS, sandbox/cpus.py)."""
    gpus = list(gpus) if device == "cuda" else []
    pinned: tuple[tuple[int, ...], ...] = ()
    if config.pin_cpus(device):
        pinned = cpus.rank_cpus(device, gpus, world_size, _node_gpus() if device == "cuda" else 0)
    return WarmKey(device, tuple(gpus), world_size, threads, pinned)


def _request_key(request: LaunchRequest) -> WarmKey:
    return warm_key(
        request.settings["device"],
        request.gpus,
        request.settings["world_size"],
        request.settings["threads_per_rank"],
    )


@contextlib.contextmanager
def timing_window(request: LaunchRequest, backend: Backend, count: int) -> Iterator[None]:
    """A benchmark's timing, inside the block: `count` warm sandboxes of this request's shape started
    and ready before it begins (one for each launch of both sides), and no other sandbox warming up
    on the GPUs (on a CPU shape none starting at all) until it ends (sandbox/pool.py, `quiet`); the
    sandboxes of launches that ended early are gone first (settle_ended)."""
    pool = warm_pool(backend)
    if pool is None:
        settle_ended(backend)
        yield
        return
    key = _request_key(request)
    pool.replenish(key, count)
    with pool.quiet(key, count):
        settle_ended(backend)
        yield


def run_launch(
    request: LaunchRequest,
    backend: Backend,
    cancel: threading.Event | None = None,
    collect: Callable[[Path], Any] | None = None,
) -> LaunchOutcome:
    """Run one launch; raises Cancelled when `cancel` was set before it ended (the launch is killed).
    `collect(launch_dir)`, when given, reads what else the launch left (untrusted) before the
    directory goes."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled before it started")
    use_extension_cache(backend)
    pool = warm_pool(backend)
    key = _request_key(request)
    slot = pool.take(key) if pool is not None and not request.cold else None
    if slot is not None:
        launch_id, launch_dir = slot.launch_id, slot.launch_dir
    else:
        launch_id = uuid.uuid4().hex[:16]
        launch_dir = new_launch_dir(launch_id)
    try:
        src = launch_dir / "src"
        src.mkdir()
        show_entries(launch_dir, extension_entries(request.extensions))
        problem_copy = src / f"problem_{request.problem_path.name}"
        shutil.copyfile(request.problem_path, problem_copy)
        if request.solution_path == request.problem_path:
            solution_copy = problem_copy
        else:
            solution_copy = src / "solution.py"
            shutil.copyfile(request.solution_path, solution_copy)
        cfg: LaunchConfig = {
            **request.settings,
            "launch_dir": str(launch_dir),
            "problem_path": str(problem_copy),
            "solution_path": str(solution_copy),
            "rank_cpus": [list(block) for block in key.cpus],
        }
        # a benchmark's or a profile's next launch is timed: the engine's teardown of this sandbox
        # must not run beside it, so only a check's launch and a benchmark's last may end before it
        ended = None
        early = request.settings["mode"] == "outputs" or request.ends_early
        if early and backend.ends_early:
            cfg["end_token"] = secrets.token_hex(16)
            ended = partial(ended_cleanly, token=cfg["end_token"])
        launch = SandboxLaunch(
            launch_id=launch_id,
            launch_dir=launch_dir,
            config=cfg,
            device=request.settings["device"],
            gpus=request.gpus,
            timeout_s=request.settings["timeout_s"],
            harness_root=config.HARNESS_ROOT,
            threads=request.settings["threads_per_rank"],
            cpus=key.cpus,
            warm=slot.handle if slot is not None else None,
            ended=ended,
        )
        log.info(
            "launch.start",
            launch=launch_id,
            mode=request.settings["mode"],
            backend=backend.name,
            world_size=request.settings["world_size"],
        )
        run = backend.run(launch, cancel)
        if run.cancelled:
            log.info("launch.cancelled", launch=launch_id)
            raise Cancelled("cancelled while running; every process of the launch was killed")
        outcome = _collect(launch_dir, request, run.launcher_log, run.killed_at_deadline, run.wall_s)
        if run.exceeded is not None:  # killed for it: what its ranks said is beside the point
            for r in outcome.ranks:
                r.state, r.stage, r.error = "error", LIMIT_STAGE, run.exceeded
        if collect is not None:
            outcome.collected = collect(launch_dir)
        log.info(
            "launch.end",
            launch=launch_id,
            wall_s=round(run.wall_s, 3),
            ok=outcome.ok,
            warm=run.warm,
            rank_cpus=[cpus.format_cpulist(r.cpus) for r in outcome.ranks],
            stages_s=longest_stages(outcome.ranks),
            # a cold launch's ranks before it: their processes' start and imports, the rendezvous
            startup_s=longest_stages(outcome.ranks, "startup"),
            # when the launcher saw the last rank end, from the launch's arrival: the rest of wall_s
            # is the host's and the sandbox's (the hand-over, the container's end, the collection)
            ranks_ended_s=round(max((r.ended_s for r in outcome.ranks), default=0.0), 3),
            sandbox_steps_s=run.steps_s,
        )
        outcome.warm = run.warm
        return outcome
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)
        if pool is not None:
            pool.replenish(key)


RECORD_CAP = 1 << 20


def ended_cleanly(launch_dir: Path, token: str) -> bool:
    """Whether the launcher has written its record (its last act) with the launch's `token` and every
    rank ended ok (exit status 0, its own status "ok"). Only the launcher knows the token (no rank is
    sent it, and other processes cannot read the launcher's memory), and it writes it once every
    process of the ranks is gone (harness/launch.py): what is left is the launcher's exit and the
    sandbox's end. A record a candidate forged has no token; one it replaced by a FIFO or a link is
    not read (sandbox/untrusted.py), and the launch is then awaited to its end."""
    # {} while it is not written
    record = typed(read_result(launch_dir / "launch.json", RECORD_CAP), LaunchRecord)
    if not hmac.compare_digest(record.get("end_token", ""), token):
        return False
    ranks = record.get("ranks", [])
    return bool(ranks) and all(r.get("state") == "ok" and r.get("exit_code") == 0 for r in ranks)


def _cpu_list(value: Any) -> list[int]:
    """A rank's reported CPUs: written inside the sandbox, so anything but a list of CPU numbers is
    taken as no report."""
    if isinstance(value, list) and len(value) <= 1 << 14 and all(type(c) is int and c >= 0 for c in value):
        return value
    return []


def _stage_times(value: Any) -> dict[str, float]:
    """A rank's reported seconds per stage: written inside the sandbox, so anything but a short map
    of short names to finite non-negative numbers is taken as no report."""
    if not isinstance(value, dict) or len(value) > 16:
        return {}
    ok = all(
        isinstance(k, str) and len(k) <= 40 and type(v) in (int, float) and 0 <= v < float("inf")
        for k, v in value.items()
    )
    return {k: float(v) for k, v in value.items()} if ok else {}


def longest_stages(ranks: list[RankOutcome], part: str = "stages") -> dict[str, float]:
    """Each stage's longest time over the ranks (`part`: their stages, or their startup): the ranks
    wait for each other, so the slowest one's stage is what the launch spent on it."""
    out: dict[str, float] = {}
    for r in ranks:
        for name, seconds in getattr(r, part).items():
            out[name] = max(out.get(name, 0.0), seconds)
    return out


def _collect(
    launch_dir: Path, request: LaunchRequest, launcher_log: str, killed: bool, wall_s: float
) -> LaunchOutcome:
    files = LaunchFiles(launch_dir, budget=request.read_budget)
    record = typed(_json(files, "launch.json", RECORD_CAP), LaunchRecord)
    world_size = request.settings["world_size"]
    entries: list[RankRecord]
    if "ranks" in record:
        entries, timed_out = record["ranks"], record.get("timed_out", False) or killed
    else:
        # the launcher itself never reported: everything it ran is lost. Killed at the deadline, it
        # had not reached its own (which it reports): the sandbox never started the ranks in time
        state = "timeout" if killed else "crashed"
        entries = [{"rank": r, "state": state} for r in range(world_size)]
        if killed:
            entries = [{**e, "stage": STARTING} for e in entries]
        timed_out = killed
    ranks: list[RankOutcome] = []
    for e in entries[:world_size]:
        rank = e.get("rank", -1)
        rank = rank if 0 <= rank < world_size else len(ranks)
        ranks.append(
            RankOutcome(
                rank=rank,
                state=e.get("state", "crashed")[:40] or "crashed",
                error=e.get("error", "")[:4000],
                stage=e.get("stage", "")[:200],
                traceback=e.get("traceback", ""),
                signal=(e.get("signal") or "")[:40] or None,
                log_tail=files.tail(f"rank{rank}.log", RANK_LOG_CAP),
                ended_s=seconds(e.get("elapsed_s")) or 0.0,
                cpus=_cpu_list(e.get("cpus")),
                stages=_stage_times(e.get("stages")),
                startup=_stage_times(e.get("startup_s")),
            )
        )
    outcome = LaunchOutcome(
        ranks=ranks, wall_s=wall_s, timed_out=timed_out, launcher_log=launcher_log[-4000:]
    )
    _read_outputs(files, request, outcome)
    outcome.convention = _convention_record(files)
    timing = _json(files, "timing.json", 64 << 20)
    outcome.timing = cast(TimingRecord, timing) if isinstance(timing, dict) else None
    _fail_on_refusals(outcome, files.refusals)
    return outcome


def _read_outputs(files: LaunchFiles, request: LaunchRequest, outcome: LaunchOutcome) -> None:
    """The output files of this launch's mode from out/: trials write t<trial>_r<rank>, benchmarks
    s<set>_r<rank> and f<fresh call>_r<rank>; any other name is left unread.

    Where outputs are expected (`request.expected`), only the expected files are read, each at most
    what its expected outputs take: a larger file is refused from its size, and one whose header
    describes other outputs from its header, before any data is read (its error then is the first
    difference, as the judge words it: tensorfile.Mismatch). The launch's byte budget is cut to what
    the expected files take, and what the host reads after them (`after`)."""
    found = files.entries("out") or []
    prefixes = "sf" if request.settings["mode"] == "benchmark" else "t"
    expected = request.expected() if request.expected is not None else None
    if expected is not None:
        after = (64 << 20) + 4096  # _collect's caps of timing.json and convention.json, read next
        wanted = sum(e.file_bytes for e in expected.values())
        files.budget = min(files.budget, files.read_bytes_total + wanted + after)
    for entry in found:
        m = OUTPUT_NAME.match(entry.name)
        if not m or m.group(1) not in prefixes:
            continue
        key = (int(m.group(2)), int(m.group(3)))
        outputs, errors = (
            (outcome.fresh_outputs, outcome.fresh_output_errors)
            if m.group(1) == "f"
            else (outcome.outputs, outcome.output_errors)
        )
        want = expected.get(entry.name) if expected is not None else None
        if expected is not None and want is None:
            continue  # no output the launch was asked for: never read
        cap = want.file_bytes if want is not None else OUTPUT_FILE_CAP
        if want is not None and entry.size > cap:
            errors[key] = (
                f"{entry.name} holds {entry.size} bytes, more than outputs of the expected shapes take "
                f"({want.data_bytes} bytes of data and a header)"
            )
            continue
        with files.open(f"out/{entry.name}", cap) as f:
            if f is None:
                errors[key] = files.refusals[-1] if files.refusals else "unreadable"
                continue
            try:
                structure, tensors, meta = tensorfile.read(
                    f, entry.name, OUTPUT_FILE_CAP, request.max_outputs, expect=want
                )
                outputs[key] = Outputs(structure, tensors, meta)
            except tensorfile.HeaderMismatch as exc:
                errors[key] = exc.difference
            except (tensorfile.TensorFileError, OSError) as exc:
                errors[key] = str(exc)


def _fail_on_refusals(outcome: LaunchOutcome, refused: list[str]) -> None:
    """A launch whose directory held something the host would not read failed, with the first such
    thing as every rank's error (where the rank said it was ok)."""
    outcome.refused = list(refused)
    if not refused:
        return
    why = f"the launch left what the host will not read: {refused[0]}"
    for r in outcome.ranks:
        if r.state == "ok":
            r.state, r.stage, r.error = "error", COLLECT_STAGE, why


def _json(files: LaunchFiles, rel: str, cap: int) -> Any:
    data = files.read(rel, cap)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError included
        return None


def _convention_record(files: LaunchFiles) -> dict[str, str] | None:
    """How rank 0 says it called the candidate: written in the sandbox, so only short strings count."""
    record = _json(files, "convention.json", 4096)
    if not isinstance(record, dict):
        return None
    declared = ConventionRecord.__annotations__
    kept = {k: v[:300] for k, v in record.items() if k in declared and isinstance(v, str)}
    return kept or None


# ---------------------------------------------------------------- tool launches (discover, build)

TOOL_RESULT_CAP = 64 << 20


@dataclass
class ToolOutcome:
    """How a discovery or build launch ended; its result file is read by the caller, with limits."""

    exit_code: int | None
    timed_out: bool
    wall_s: float
    log: str  # the launcher's and the tool's last lines, for messages
    warm: bool = False  # it ran in a warm tool sandbox (ToolLaunches)


class ToolLaunches:
    """Runs harness tool programs (harness/discover.py, harness/build.py) as sandbox launches of their own:
    the same backends, limits, deadline and labels as checks, one CPU sandbox each. Where the backend
    keeps warm sandboxes and isolates them, a tool launch takes a warm tool sandbox (TOOL_SHAPE), whose
    launcher has imported torch and the build program: 3-3.5 s of a build launch on a GPU node."""

    def __init__(self, backend: Backend, cancel: threading.Event | None = None) -> None:
        self.backend = backend
        self.cancel = cancel
        self.isolated = backend.isolated

    def new_dir(self) -> Path:
        """A launch directory for the caller to write the tool's inputs into; `run` removes it."""
        return new_launch_dir(uuid.uuid4().hex[:16])

    def run(self, mode: str, launch_dir: Path, params: dict[str, Any], timeout_s: float) -> ToolOutcome:
        """Run the tool in `launch_dir` (which stays for the caller to read and then remove)."""
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("cancelled before it started")
        use_extension_cache(self.backend)
        launch_id = launch_dir.name.removeprefix("pkb-launch-").split("-", 1)[0]
        cfg = {"mode": mode, "launch_dir": str(launch_dir), "timeout_s": timeout_s, **params}
        slot = self._warm(launch_dir)
        launch = SandboxLaunch(
            launch_id=launch_id,
            launch_dir=launch_dir,
            config=cfg,
            device="cpu",
            gpus=[],
            timeout_s=timeout_s,
            harness_root=config.HARNESS_ROOT,
            threads=TOOL_SHAPE.threads,
            warm=slot.handle if slot is not None else None,
        )
        log.info("tool.start", launch=launch_id, tool=mode, backend=self.backend.name, warm=slot is not None)
        run = self.backend.run(launch, self.cancel)
        if run.cancelled:
            raise Cancelled("cancelled while running; every process of the launch was killed")
        files = LaunchFiles(launch_dir)
        record = typed(_json(files, "launch.json", RECORD_CAP), ToolRecord)
        exit_code = record.get("exit_code")
        timed_out = run.killed_at_deadline or (exit_code is None and mode == "discover")
        own_log = files.tail(f"{mode}.log", 4000)
        if files.refusals:  # the tool's candidate code left a trap where the host reads
            own_log = f"{files.refusals[0]}\n{own_log}"
        log.info(
            "tool.end",
            launch=launch_id,
            tool=mode,
            wall_s=round(run.wall_s, 3),
            tool_s=seconds(record.get("wall_s")),  # the tool's own run
            exit_code=exit_code,
        )
        return ToolOutcome(
            exit_code=exit_code if isinstance(exit_code, int) else None,
            timed_out=timed_out,
            wall_s=run.wall_s,
            log=(own_log or run.launcher_log)[-4000:],
            warm=run.warm,
        )

    def _warm(self, launch_dir: Path) -> WarmSlot | None:
        """A warm tool sandbox for this launch, or None. Its container mounts its own directory, which
        takes the place of `launch_dir`, with what the caller wrote there: a bind mount follows its
        directory when it is renamed."""
        pool = warm_pool(self.backend)
        if pool is None or not self.isolated:
            return None
        slot = pool.take(TOOL_SHAPE)
        pool.replenish(TOOL_SHAPE)  # for the next one
        if slot is None:
            return None
        try:
            for entry in list(launch_dir.iterdir()):
                os.rename(entry, slot.launch_dir / entry.name)
            os.rename(slot.launch_dir, launch_dir)
        except OSError as exc:
            log.warning("warm.tool_unusable", launch=slot.launch_id, error=repr(exc)[:300])
            for entry in list(slot.launch_dir.iterdir()) if slot.launch_dir.is_dir() else []:
                with contextlib.suppress(OSError):
                    os.rename(entry, launch_dir / entry.name)
            pool.discard(slot)
            return None
        return slot


def seconds(value: Any) -> float | None:
    """A duration a launch wrote (untrusted): a plausible number of seconds, or None."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e5
    return round(float(value), 3) if ok else None


def read_result(path: Path, cap: int = TOOL_RESULT_CAP) -> Any:
    """A JSON file a launch wrote, read through the doorway (sandbox/untrusted.py) from its folder:
    None when missing, anything but a plain file, over `cap` bytes, or not JSON."""
    return _json(LaunchFiles(path.parent), path.name, cap)
