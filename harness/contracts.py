"""The records that cross the boundary between the host and the sandbox, each defined once (stdlib only).

Into the sandbox (the host writes, the harness reads with `read_*` below):
  LaunchConfig   the launch file (or stdin): pkb_mcp/launches.py -> harness/launch.py
  ToolConfig     the launch file of a discovery or build launch (pkb_mcp/launches.py ToolLaunches)
  WarmSetup      `--warm`: what a warm sandbox starts its ranks with (sandbox/base.py)
  RankSetup      a worker's first stdin line: harness/launch.py -> harness/worker.py
  RankConfig     a worker's second stdin line: the launch, and the rank's number
  TimingConfig   how a benchmark or profile samples (pkb_mcp/runs/benchmark.py), inside LaunchConfig
  CounterPlan    a profile's counter launch: each rank under its own Nsight Compute (harness/counters.py)

Out of the sandbox (the harness writes, the host reads as untrusted, with size limits):
  RankRecord        rank{rank}.status.json (the worker's part) and each rank's entry of launch.json
  LaunchRecord      launch.json, written by the launcher
  ToolRecord        launch.json of a discovery or build launch
  TimingRecord      timing.json, written by rank 0 of a benchmark
  ConventionRecord  convention.json: how rank 0 called the candidate
  ProfileInfo       profile/r{rank}.info.json
  BuildRecord       build.json of a build launch (harness/build.py)

(discover.py's discovered.json is written by a script run in isolated mode, which cannot import this
module; its shape is in that file's docstring.)

These are JSON on the wire. The types say what each side may rely on when the other is honest and let
mypy check both sides against one definition. The readers check what the harness is handed: every
key the record requires, no key it does not define, each value of its type, or `ContractError` with
one sentence naming the key. Files written where candidate code ran are never trusted: the host
parses them field by field (pkb_mcp/launches.py, pkb_mcp/runs/verdicts.py,
pkb_mcp/profiling/traces.py), and the launcher keeps only the well-typed fields of a rank's status
(`read_rank_status`).
"""

# No `from __future__ import annotations`: the readers and NotRequired need the annotations evaluated.
import types
import typing
from typing import Any, NotRequired, TypedDict, cast


class TimingConfig(TypedDict, total=False):
    """How one side of a benchmark is sampled (pkb_mcp/runs/benchmark.py's GPU_TIMING and CPU_TIMING,
    docs/measurement.md); the keys after `fresh_bytes` are set per launch."""

    warmup_ms: float
    max_warmup: int
    min_samples: int
    max_samples: int
    budget_ms: float
    min_span_ms: float
    precision: float
    l2_bytes: int
    max_sets: int
    rotation_bytes: int
    fresh_min: int
    fresh_max: int
    fresh_bytes: int
    min_sleep_us: float
    fresh_label: str  # the launch's label for its fresh seeds
    fresh_top_up: bool  # the reference's launch: outputs for every judged fresh seed
    calls: int  # a profile: calls profiled after the warm-up


class CounterPlan(TypedDict):
    """A profile's counter launch (docs/nvlink-counters.md): every rank's worker starts under its own
    Nsight Compute, which counts `metrics` for the kernels of one call (pkb_mcp/profiling/nvlink.py
    plans it, harness/counters.py runs it)."""

    tool: str  # "ncu"
    ncu: str  # the ncu executable as the sandbox sees it
    metrics: list[str]
    max_kernels: int  # kernels profiled per rank at most (ncu --launch-count)


class LaterTrials(TypedDict):
    """Trials a reference's launch runs after its own, at a size with seeds of their own: a check's
    unseen-size trial (pkb_mcp/runs/unseen.py), or a later check's trials run ahead
    (pkb_mcp/runs/references.py), so that their reference takes no sandbox of its own. Their outputs
    are numbered after the launch's trials (group after group), each group's keyed by its seeds."""

    size: dict[str, Any]
    seeds: list[int]  # secret, as the launch's own


class LaunchSettings(TypedDict):
    """What a run decides of one start of a problem's ranks (pkb_mcp/runs/run.py, `Run.launch`); where
    the launch is started, its directory, its copies of the files and its CPUs complete it."""

    mode: str  # "outputs", "benchmark" or "profile"
    world_size: int
    device: str  # "cpu" or "cuda"
    size: dict[str, Any]  # the size preset's values
    dtype: str
    seeds: list[int]  # secret: only on stdin, never in the launch directory
    tolerance: dict[str, Any]  # the problem's bounds, per output where it says so
    timeout_s: float
    timing: TimingConfig | None
    threads_per_rank: int
    convention: str  # how the candidate is called: auto, ours, original
    counters: NotRequired[CounterPlan]  # a profile's counter launch: cold, every rank under ncu
    later: NotRequired[list[LaterTrials]]  # mode "outputs", the problem's reference only


class LaunchConfig(LaunchSettings):
    """One start of a problem's ranks: what the host writes for the launcher (pkb_mcp/launches.py)."""

    launch_dir: str
    problem_path: str
    solution_path: str
    rank_cpus: list[list[int]]  # each rank's CPU cores (sandbox/cpus.py); [] = not pinned
    # a secret of the host that the launcher alone knows and writes into its record once nothing of
    # the candidate runs (the host may then stop waiting for the sandbox's end); never sent to a rank
    end_token: NotRequired[str]


class RankConfig(LaunchConfig):
    """What one rank gets: the launch, and its rank."""

    rank: int


class BuildCommand(TypedDict):
    """One compiler run a build launch makes (planned on the host, pkb_mcp/compile)."""

    argv: list[str]
    cwd: NotRequired[str]  # default: the launch directory
    header: NotRequired[str]  # a C++ syntax check: the key of torch's precompiled header it may use


class ToolConfig(TypedDict):
    """A launch that runs one program instead of ranks (harness/launch.py `run_tool`)."""

    mode: str  # "discover" or "build"
    launch_dir: str
    timeout_s: float
    solution_path: NotRequired[str]  # discover: the file to import
    commands: NotRequired[list[BuildCommand]]  # build: compiler runs
    extensions: NotRequired[list[dict[str, Any]]]  # build: harness.extensions.Request.to_json()
    headers: NotRequired[list[dict[str, Any]]]  # build: {extra_cflags, with_cuda} (harness/headers.py)
    parts: NotRequired[list[dict[str, Any]]]  # build: requests whose CUDA unit's part to precompile


class WorkerSetup(TypedDict):
    """What a rank needs before its launch, to join the process group: nothing secret."""

    launch_dir: str
    world_size: int
    device: str
    threads_per_rank: int
    rank_cpus: list[list[int]]
    setup_timeout_s: float  # how long the ranks may take to find each other
    # a warm sandbox's ranks touch no GPU until the host opens it (GO_NAME in the launch directory, or
    # the launch itself): each writes rank{rank}.staged, then waits for a go line (sandbox/pool.py)
    gated: NotRequired[bool]


GO_NAME = ".warm-go"  # in a gated warm sandbox's launch directory: the host lets its ranks use the GPUs
GO_LINE = {"go": True}  # then the launcher tells each rank so: its second line on stdin
# what rank{rank}.ready holds: the seconds of each part of the rank's GPU step (or, on CPU, of the group
# set-up), as a JSON object of these keys (sandbox/pool.py reads it, with limits, for its log)
READY_STEPS = ("context_s", "group_s", "collective_s")


class WarmSetup(WorkerSetup):
    """A warm sandbox's start (`harness.launch --warm`): its ranks' set-up, and how long it waits."""

    idle_s: float  # no launch by then: the sandbox exits and writes nothing


class RankSetup(WorkerSetup):
    """A worker's first line on stdin."""

    rank: int
    warm: bool  # started ahead of its launch: it prepares, while it waits, what launches often need


class TimingRecord(TypedDict, total=False):
    """A benchmark launch's samples and what happened while taking them (timing.json, rank 0)."""

    device_ms: list[float]
    wall_ms: list[float]
    warmup_calls: int
    stop_reason: str
    sampled_ms: float
    timed_output_mismatches: list[int]
    input_sets: int
    clock: str
    alignment_sleep_us: float
    rotated_inputs: bool
    fresh_ms: list[float]
    fresh_wall_ms: list[float]
    fresh_after: list[int]
    fresh_timed: int
    fresh_judged: list[int]
    inputs_mutated_while_timing: bool
    per_set_bytes: int
    host_clock_ms: list[float]  # calls timed by the host clock alone, from an idle device
    host_waited_calls: int  # sampled calls that returned after the device had begun them
    mac: str  # keyed digest of the rest (harness.tensorfile.mac_record): the host rejects a forged file
    launch_samples: list[int]  # pooled on the host: each launch's sample count


STARTING = "starting"  # a RankRecord's stage where the deadline passed before the rank had started


class RankRecord(TypedDict, total=False):
    """How one rank ended. The worker writes its part (state, with stage, error and traceback on a
    failure; elapsed_s, cpus, stages) to rank{rank}.status.json; the launcher, which saw the process
    end, completes it for launch.json (rank, exit_code, signal, and a state of its own where the
    worker could not report one)."""

    rank: int
    state: str  # ok, error, crashed, timeout, aborted, exited
    exit_code: int | None
    signal: str | None
    error: str
    stage: str
    traceback: str
    elapsed_s: float  # from the launch's start to the rank's end (launch.json: by the launcher's clock)
    cpus: list[int] | None  # the CPUs the rank could run on, as it saw them at start
    stages: dict[str, float] | None  # seconds in each stage of the launch (harness.worker.Stages)
    # a rank started with its launch (not warm), before the launch: "process" (from its process's start:
    # a new interpreter's start and imports, or a fork's), "group" (the rendezvous, the process group
    # and one collective)
    startup_s: dict[str, float] | None


class LaunchRecord(TypedDict):
    """launch.json: every rank's outcome, the launch's wall time, and whether its deadline passed."""

    ranks: list[RankRecord]
    wall_s: float
    timed_out: bool
    end_token: NotRequired[str]  # the configuration's, once nothing of the ranks can run any more


class ToolRecord(TypedDict):
    """launch.json of a discovery or build launch."""

    tool: str
    exit_code: int | None  # None: killed at the deadline
    wall_s: float


class ConventionRecord(TypedDict):
    """convention.json (rank 0): the convention asked for, the one used, and why (the host's notes)."""

    requested: str
    used: str
    why: str


class NvlinkCounts(TypedDict):
    """NVML's NVLink payload bytes of a rank's GPU over its counted calls (harness/counters.py)."""

    calls: int  # calls counted
    tx_bytes: int  # sent over NVLink during them, alignment baseline subtracted
    rx_bytes: int  # received
    per_call_tx: list[int]  # each call's own reading (the counters' granularity shows here)
    per_call_rx: list[int]
    baseline_tx: int  # what one aligned empty call sends (subtracted)
    baseline_rx: int


class ProfileInfo(TypedDict):
    """profile/r{rank}.info.json: a rank's profiled calls (harness/profile.py). A counter launch
    writes one too, with `counted` and no trace."""

    rank: int
    calls: int
    warmup_calls: int
    event_ms: list[float]  # each profiled call's device-event time
    alignment_sleep_us: float
    nvlink: NotRequired[NvlinkCounts]  # NVML's counts of the calls after the profiled ones
    nvlink_why: NotRequired[str]  # why there are none
    counted: NotRequired[int]  # a counter launch: calls run between cudaProfilerStart and Stop


class CommandResult(TypedDict):
    """One compiler run of a build launch; paths of the launch directory written as `<build>`."""

    returncode: int | None  # None: killed at the deadline
    output: str
    elapsed_s: float
    header: NotRequired[bool]  # given a header key that the view had: whether GCC took the header


class ExtensionBuild(TypedDict):
    """One extension build of a build launch; the built files stay in extensions/<key>/."""

    key: str | None  # None: the request was refused before a key existed
    name: str
    ok: bool
    log: str
    elapsed_s: float
    steps_s: NotRequired[dict[str, float]]  # "plan", "compile" (harness/extensions.py build)
    parts: NotRequired[list[dict[str, Any]]]  # its CUDA units' parts: harness/prefixes.py Part


class HeaderBuild(TypedDict):
    """One precompiled header a build launch made (or found in the cache): headers/<key>/, or a CUDA
    unit's headers' part: prefixes/<key>/."""

    key: str | None
    ok: bool
    cached: bool
    log: str
    elapsed_s: float


class BuildRecord(TypedDict):
    """build.json (harness/build.py)."""

    commands: list[CommandResult]
    extensions: list[ExtensionBuild]
    headers: NotRequired[list[HeaderBuild]]
    parts: NotRequired[list[HeaderBuild]]
    import_s: NotRequired[float]  # torch's import, before the builds


# ------------------------------------------------------------------ readers


class ContractError(ValueError):
    """A record that does not match its definition here; the message is one sentence naming the key."""


def read_launch_config(data: object) -> LaunchConfig:
    """A launch's configuration, as the launcher is handed it."""
    return cast(LaunchConfig, _check(LaunchConfig, data, "the launch configuration"))


def read_tool_config(data: object) -> ToolConfig:
    """A discovery or build launch's configuration."""
    return cast(ToolConfig, _check(ToolConfig, data, "the tool launch's configuration"))


def read_worker_setup(data: object) -> WorkerSetup:
    """The `--ranks` set-up of a launch whose ranks are forks of its launcher (harness/launch.py)."""
    return cast(WorkerSetup, _check(WorkerSetup, data, "the ranks' set-up"))


def read_warm_setup(data: object) -> WarmSetup:
    """The `--warm` set-up of a warm sandbox."""
    return cast(WarmSetup, _check(WarmSetup, data, "the warm set-up"))


def read_rank_setup(data: object) -> RankSetup:
    """A worker's set-up line."""
    return cast(RankSetup, _check(RankSetup, data, "the rank's set-up"))


def read_rank_config(data: object) -> RankConfig:
    """A worker's launch line."""
    return cast(RankConfig, _check(RankConfig, data, "the rank's launch configuration"))


def read_rank_status(data: object) -> RankRecord:
    """A rank's status file: written in the process where candidate code ran, so only its well-typed
    fields are kept (anything else reads as no report)."""
    if not isinstance(data, dict):
        return {}
    hints = _hints(RankRecord)
    return cast(RankRecord, {k: v for k, v in data.items() if k in hints and _problem(hints[k], v) is None})


def _check(kind: Any, data: object, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ContractError(f"{what} must be a JSON object, not {_name(data)}")
    problem = _problem(kind, data)
    if problem is not None:
        raise ContractError(f"{what} {problem} (harness/contracts.py {kind.__name__})")
    return data


def _hints(kind: Any) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, dict) and hasattr(kind, "__required_keys__")


def _problem(kind: Any, value: object, where: str = "") -> str | None:
    """Why `value` is not of the annotated type `kind` (a phrase for the message), or None."""
    at = f"'{where}'" if where else "the value"
    if kind is Any:
        return None
    if _is_record(kind):
        if not isinstance(value, dict):
            return f"needs {at} to be an object, not {_name(value)}"
        hints = _hints(kind)
        missing = sorted(kind.__required_keys__ - value.keys())
        if missing:
            return f"lacks the key '{_join(where, missing[0])}'"
        for key, item in value.items():
            if key not in hints:
                return f"has a key '{_join(where, str(key))}' that its contract does not define"
            problem = _problem(hints[key], item, _join(where, key))
            if problem is not None:
                return problem
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        problems = [_problem(arg, value, where) for arg in args]
        if None in problems:
            return None
        inner = [p for arg, p in zip(args, problems, strict=True) if arg is not type(None)]
        if isinstance(value, dict | list) and len(inner) == 1:
            return inner[0]  # an optional object or list: what is wrong inside it
        return f"needs {at} to be {' or '.join(_type_name(a) for a in args)}, not {_name(value)}"
    if origin is list:
        if not isinstance(value, list):
            return f"needs {at} to be a list, not {_name(value)}"
        for i, item in enumerate(value):
            problem = _problem(args[0], item, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"needs {at} to be an object, not {_name(value)}"
        for key, item in value.items():
            problem = _problem(args[1], item, _join(where, str(key)))
            if problem is not None:
                return problem
        return None
    if kind is type(None):
        ok = value is None
    elif kind is float:  # JSON writes a whole number without a point
        ok = type(value) in (int, float)
    else:  # bool is an int to Python, not to the contract
        ok = type(value) is kind
    return None if ok else f"needs {at} to be {_type_name(kind)}, not {_name(value)}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_name(kind: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    if kind in names:
        return names[kind]
    origin = typing.get_origin(kind)
    if origin is list:
        return "a list"
    if origin is dict or _is_record(kind):
        return "an object"
    return str(kind)


def _name(value: object) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    return names.get(type(value), type(value).__name__)
