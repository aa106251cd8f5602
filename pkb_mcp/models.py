"""The service layer's models: the one request every run verb takes (`RunRequest`), and the results
the CLI prints and the MCP tools return.

Each figure is defined once, here, in its field's description; docs/measurement.md expands on the
timing and roofline definitions. Every model derives from `Result`, whose JSON schema carries no
titles: the schemas go into every agent's context with tools/list, and a title repeats the field name.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pkb_mcp import config
from pkb_mcp.errors import UserError


def lean_property(prop: dict[str, Any]) -> None:
    """One property's schema without a title or a default of null (tools/list publishes an
    optional value portably: pkb_mcp/frontends/schemas.py)."""
    prop.pop("title", None)
    if prop.get("default", 0) is None:
        prop.pop("default")


def _lean(schema: dict[str, Any]) -> None:
    """Output schemas without what an agent does not need: titles (they repeat the field names) and
    defaults (a result always has every field)."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        lean_property(prop)
        prop.pop("default", None)


Kind = Literal["compile", "check", "bench", "profile"]  # the verbs that run as jobs (service.VERBS)
# RunRequest.launches in words, for the bench tool's argument and `pkb bench --launches`
LAUNCHES_HELP = (
    "separate launches per side, alternating: more resolve smaller differences (docs/measurement.md)"
)


# A run request's rules, said once: RunRequest holds every request to them, and the MCP tools'
# arguments and the CLI's choices are these types (pkb_mcp/frontends/server.py, cli.py).
MAX_WORLD_SIZE = 64
MAX_TIMEOUT_S = 3600  # seconds
MAX_TRIALS = 100
MAX_LAUNCHES = 8
MAX_CALLS = 20
VariantName = Literal["pkb", "original"]  # pkb's workload, or the original benchmark's exactly
DeviceName = Literal["cpu", "cuda"]
SandboxName = Literal["auto", "docker", "process"]
ConventionName = Literal["auto", "ours", "original"]  # how solution() is called (auto: by its signature)
WorldSize = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]  # then each problem's own rule (the suite's: 2+)
TimeoutS = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
Trials = Annotated[int, Field(ge=1, le=MAX_TRIALS)]
Launches = Annotated[int, Field(ge=1, le=MAX_LAUNCHES)]
Calls = Annotated[int, Field(ge=1, le=MAX_CALLS)]


def choices(literal: Any) -> list[str]:
    """A Literal type's values, for a CLI option's choices."""
    return list(get_args(literal))


class RunRequest(BaseModel):
    """One request to a verb, whole, from the MCP tool, the CLI, `pkb eval` or a stored job down to the
    launches: a new run option is one field here, its rule in its type. Each verb reads the fields it
    uses (compile: `path` and `sandbox`; check: `trials`; bench: `launches`; profile: `calls` and its
    folders) and leaves the others at their defaults. The job store keeps it as JSON and reads it back
    through this model. `RunRequest.of` makes one from what a user gave, refusing it in one sentence."""

    model_config = ConfigDict(extra="forbid")

    path: str  # the solution (or .cu file) as the host keeps it; read as text, run only in the sandbox
    problem: int | str = 0  # id or name (compile has none)
    world_size: WorldSize = 4
    size: str = "pkb"  # a preset of the problem's SIZES (checked against the problem, not here)
    variant: VariantName = "pkb"  # docs/variants.md
    device: DeviceName | None = None  # None: cuda where a GPU is present
    timeout_s: TimeoutS = 300.0  # each launch's wall-clock limit
    sandbox: SandboxName = "auto"
    convention: ConventionName = "auto"
    trials: Trials = 5  # check
    # check: after a pass, one trial at a size it was never shown (runs/unseen.py; PKB_UNSEEN_SIZES)
    unseen: bool = Field(default_factory=config.unseen_sizes)
    launches: Launches = 1  # bench: launches a side
    calls: Calls = 3  # profile: calls profiled a side after the warm-up
    out_dir: str | None = None  # profile: the folder for its trace and timeline, as given
    profiles_dir: str | None = None  # profile: else a new folder under this one (default: the state dir's)
    gpus: list[int] | None = None  # set when a job starts: the GPUs it holds

    @field_validator("path", "out_dir", "profiles_dir", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, PurePath) else value

    @classmethod
    def of(cls, **given: Any) -> RunRequest:
        """A request from a user's values (CLI options, `pkb eval`'s settings): UserError naming the
        first value its rules refuse, in one sentence."""
        try:
            return cls(**given)
        except ValidationError as exc:
            raise UserError(refusal(exc)) from exc


_WORDS = {"world_size": "world size", "timeout_s": "timeout (seconds)"}  # else the field's name


def refusal(exc: ValidationError) -> str:
    """The first refused value of a RunRequest in one sentence: its rule, then what was given."""
    first = exc.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else "the request"
    words, given = _WORDS.get(name, name), first.get("input")
    field = RunRequest.model_fields.get(name)
    rules = field.metadata if field is not None else []
    bounds = {k: v for m in rules for k in ("ge", "gt", "le") if (v := getattr(m, k, None)) is not None}
    if first["type"] in ("greater_than_equal", "greater_than", "less_than_equal") and "le" in bounds:
        low = f"between {bounds['ge']:g} and" if "ge" in bounds else f"more than {bounds['gt']:g} and at most"
        return f"{words} must be {low} {bounds['le']:g}, not {given!r}"
    if first["type"] == "literal_error":
        return f"{words} must be {first['ctx']['expected']}, not {given!r}"
    return f"{words}: {first['msg'][:1].lower()}{first['msg'][1:]}, not {given!r}"


class Result(BaseModel):
    """A model whose JSON schema (in tools/list) is lean: see `_lean`."""

    model_config = ConfigDict(json_schema_extra=_lean)


RankState = Literal["pass", "wrong", "error", "crashed", "timeout", "aborted", "exited"]
Verdict = Literal["pass", "fail", "timeout"]
# "suspect": every output was right but the time is not credited: below the physical floor, or much
# faster on input sets seen before than on fresh ones
BenchVerdict = Literal["pass", "fail", "timeout", "suspect"]


# A check's or benchmark's `protections` (pkb_mcp/runs/protections.py names them)
PROTECTIONS_NOTE = "original variant: correct by its rules, failed by these of pkb's (docs/variants.md)"


class ProblemSummary(Result):
    id: int
    name: str
    category: str
    source: str
    dtype: str
    world_sizes: str = Field(description="the world-size rule in words")
    summary: str


class ProblemRow(Result):
    # A row of list_problems: what a problem is picked by; with `detail`, also its source, dtype and
    # world-size rule (absent, not null, without it).
    id: int
    name: str
    category: str
    summary: str
    source: str | None = None
    dtype: str | None = None
    world_sizes: str | None = None


class ProblemPage(Result):
    problems: list[ProblemRow]
    total: int  # problems that match the filters
    offset: int
    next_offset: int | None = None  # where the next page starts; absent on the last


class InputSpec(Result):
    name: str
    shape: list[int] | None = None
    dtype: str | None = None
    value: str | None = Field(None, description="repr of a non-tensor argument")


class Traffic(Result):
    nvlink_bytes: float = Field(description="per GPU, each way")
    hbm_bytes: float = Field(description="per GPU, read + write")
    flops: float = Field(description="per GPU")
    rounds: float = Field(description="dependent communication steps")


class Floor(Result):
    # What binds a problem's floor and the exchange's share of it, each term over floor_ms
    # (pkb_mcp/roofline.py defines them). Comments, not a docstring: it would go into tools/list.

    floor_ms: float = Field(description="max(nvlink, hbm, compute) + latency")
    bound: str
    nvlink_share: float = Field(description="nvlink_ms / floor_ms")
    latency_share: float = Field(description="latency_ms / floor_ms")


class OriginalConvention(Result):
    # How a file written for the original benchmark is called on this problem (harness/convention.py).
    signature: str
    call: str | None = Field(None, description="as the harness makes it; null if it cannot")
    callable: bool
    differences: str = Field("", description="where this workload deliberately differs")


class ProblemDetail(ProblemSummary):
    description: str
    signature: str
    world_size: int
    size_preset: str
    size: dict[str, object]
    sizes: dict[str, dict[str, object]]
    tolerance: dict[str, Any] = Field(description="each output's; 'outputs': own, by index")
    mutates_inputs: bool
    inputs: list[InputSpec] = Field(description="rank 0's")
    traffic: Traffic
    floor: Floor = Field(description="at the node's ceilings")
    minor_exchange: str | None = Field(None, description="why the exchange cannot be a material share")
    reference_source: str
    variant: str = "pkb"  # pkb's workload, or the original benchmark's exactly (docs/variants.md)
    original: OriginalConvention | None = Field(None, description="the original benchmark's convention")


class Mismatch(Result):
    output: int
    index: list[int]  # the first failing element
    expected: str
    got: str


class RankResult(Result):
    rank: int
    trial: int | None = None
    state: RankState
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rel_norm_error: float | None = None
    mismatched: int | None = None
    first_mismatch: Mismatch | None = None
    traceback: str | None = None
    log_tail: str | None = None
    ended_s: float | None = Field(None, description="when it failed, s into the launch")


class SandboxInfo(Result):
    backend: str
    isolated: bool
    note: str = ""


class StaticReport(Result):
    # What the source calls, read from its text without running it (pkb_mcp/runs/static_report.py).

    collectives: list[str]
    compute_ops: list[str]
    multicast: bool  # uses NVLink multicast: refused before running
    multicast_uses: list[str] = []
    suspicious: list[str]  # patterns worth review (docs/adversarial.md)


class UnseenResult(Result):  # where the trial at a size never shown ran (runs/unseen.py), and what it found
    world_size: int
    size: dict[str, Any]  # the size's values: a preset's, with the drawn ones over them
    message: str  # the first failing rank's outcome, where one failed


GENERALIZES_NOTE = "after a pass: whether it also matched at a size never shown; null: not judged"


class CheckResult(Result):
    problem_id: int
    problem: str
    world_size: int
    size: str
    device: str
    trials: int
    verdict: Verdict
    message: str
    ranks: list[RankResult] = Field(description="each rank's worst outcome")
    protections: list[str] = Field([], description=PROTECTIONS_NOTE)
    generalizes: Literal["yes", "no"] | None = Field(None, description=GENERALIZES_NOTE)
    unseen: UnseenResult | None = None
    wall_s: float
    sandbox: SandboxInfo
    warnings: list[str] = []
    notes: list[str] = []  # what was built for the run (load_inline extensions)
    static_report: StaticReport | None = None


class TimingStats(Result):
    median_ms: float = Field(
        description="median over timed calls of the slowest rank's time (docs/measurement.md)"
    )
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    samples: int
    stop_reason: str
    sampled_ms: float = 0.0
    warmup_calls: int
    input_sets: int
    clock: str
    wall_median_ms: float = Field(description="host clock cross-check")
    launches: int = 1
    launch_spread: float | None = Field(None, description="sd of log(median) between launches")
    fresh_calls: int = 0
    fresh_median_ms: float | None = None
    replay_advantage: float | None = None
    replay_advantage_p: float | None = None
    host_clock_median_ms: float | None = None  # the host's share (docs/measurement.md)
    host_waited_calls: int = 0


class Ceilings(Result):
    nvlink_gbps: float = Field(description="per GPU, each way")
    hbm_gbps: float = Field(description="read + write")
    tflops: dict[str, float] = Field(description="peak rate per dtype, TFLOP/s")
    round_latency_us: float = Field(description="per dependent step")
    source: str


class FloorPlacement(Floor):
    # Where a measured time sits against the problem's floor (the roofline tool gives the floor's terms
    # and the traffic and ceilings behind them).

    time_ms: float | None = None
    pct_of_floor: float | None = Field(None, description="floor / time x 100")
    note: str = ""


class RooflineResult(FloorPlacement):
    problem_id: int
    problem: str
    world_size: int
    size: str
    traffic: Traffic
    ceilings: Ceilings
    nvlink_ms: float
    hbm_ms: float
    compute_ms: float
    latency_ms: float

    def placement(self) -> FloorPlacement:
        return FloorPlacement.model_validate(self.model_dump(include=set(FloorPlacement.model_fields)))

    def binding(self) -> Floor:
        return Floor.model_validate(self.model_dump(include=set(Floor.model_fields)))


class BenchResult(Result):
    problem_id: int
    problem: str
    world_size: int
    size: str
    device: str
    verdict: BenchVerdict = Field(
        description="suspect: outputs right, not credited (below_floor or faster_on_seen_inputs)"
    )
    message: str
    reference: TimingStats | None = None
    candidate: TimingStats | None = None
    speedup: float | None = Field(None, description="reference median / candidate median")
    speedup_low: float | None = Field(None, description="reference q1 / candidate q3")
    speedup_high: float | None = Field(None, description="reference q3 / candidate q1")
    roofline: FloorPlacement | None = None
    below_floor: bool = Field(False, description="the candidate's median is below the roofline floor")
    fresh_speedup: float | None = None
    seen_inputs_advantage: float | None = None
    faster_on_seen_inputs: bool = False
    within_noise: bool | None = Field(
        None, description="within identical code's run-to-run spread here: no evidence, not credited"
    )
    ranks: list[RankResult] = []
    protections: list[str] = Field([], description=PROTECTIONS_NOTE)
    wall_s: float
    sandbox: SandboxInfo
    warnings: list[str] = []
    notes: list[str] = []  # what was built for the run (load_inline extensions)
    static_report: StaticReport | None = None


class Calibration(Result):
    ceilings: Ceilings
    details: dict[str, Any] = Field(description="every measurement behind the ceilings")
    saved_to: str | None = Field(default=None, description="the calibration file the roofline now reads")
