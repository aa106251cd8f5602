"""Result models of the service layer: what the CLI prints and (next) what the MCP tools return.

Each figure is defined once, here, in its field's description; docs/measurement.md expands on the
timing and roofline definitions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

RankState = Literal["pass", "wrong", "error", "crashed", "timeout", "aborted", "exited"]
Verdict = Literal["pass", "fail", "timeout"]
# "suspect": every output was right but the time is below the physical floor, so it is not credited
BenchVerdict = Literal["pass", "fail", "timeout", "suspect"]


class ProblemSummary(BaseModel):
    id: int
    name: str
    category: str
    source: str
    dtype: str
    world_sizes: str = Field(description="the world-size rule in words")
    summary: str


class InputSpec(BaseModel):
    name: str
    shape: list[int] | None = None
    dtype: str | None = None
    value: str | None = Field(None, description="repr of a non-tensor argument")


class Traffic(BaseModel):
    nvlink_bytes: float = Field(description="bytes each GPU must send (= receive) over NVLink, one direction")
    hbm_bytes: float = Field(description="bytes each GPU must read plus write in HBM")
    flops: float = Field(description="floating-point operations per GPU")
    rounds: float = Field(description="dependent communication steps (latency term)")


class OriginalConvention(BaseModel):
    """How a file written for the original benchmark is called on this problem (harness/convention.py)."""

    signature: str = Field(description="the original benchmark's solution() signature")
    call: str | None = Field(
        None, description="the call the harness makes from this problem's inputs; None if it cannot"
    )
    callable: bool = Field(description="whether original-convention files can run on this problem")
    differences: str = Field("", description="where this workload deliberately differs from the original")


class ProblemDetail(ProblemSummary):
    description: str
    signature: str
    world_size: int
    size_preset: str
    size: dict[str, object]
    sizes: dict[str, dict[str, object]]
    tolerance: dict[str, float]
    mutates_inputs: bool
    inputs: list[InputSpec] = Field(description="rank 0's inputs at this world size and size preset")
    traffic: Traffic
    reference_source: str
    original: OriginalConvention | None = Field(
        None, description="the original benchmark's signature, call and stated differences"
    )


class Mismatch(BaseModel):
    output: int = Field(description="index of the output tensor")
    index: list[int] = Field(description="first element that fails the elementwise check")
    expected: str
    got: str


class RankResult(BaseModel):
    rank: int
    trial: int | None = Field(None, description="the first trial with this rank's worst outcome")
    state: RankState
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rel_norm_error: float | None = Field(None, description="‖out−ref‖ / ‖ref‖ over all outputs")
    mismatched: int | None = Field(None, description="elements failing allclose")
    first_mismatch: Mismatch | None = None
    traceback: str | None = None
    log_tail: str | None = None
    ended_s: float | None = Field(None, description="seconds into the job when this rank failed")


class SandboxInfo(BaseModel):
    backend: str
    isolated: bool
    note: str = ""


class StaticReport(BaseModel):
    """What the solution's source still calls, read from its text without running it."""

    collectives: list[str] = Field(
        description="torch.distributed collectives, functional collectives and symmetric-memory ops "
        "referenced"
    )
    compute_ops: list[str] = Field(description="dense torch compute ops used (matmul, @, F.linear, ...)")
    multicast: bool = Field(description="uses NVLink multicast (multimem / NVLS): refused before running")
    multicast_uses: list[str] = Field([], description="where multicast is used")
    suspicious: list[str] = Field(
        description="patterns worth review: harness imports, files, environment, threads, processes, "
        "ctypes, monkeypatching, introspection, pointer-keyed caches, state kept across calls"
    )


class CheckResult(BaseModel):
    problem_id: int
    problem: str
    world_size: int
    size: str
    device: str
    trials: int
    verdict: Verdict
    message: str
    ranks: list[RankResult] = Field(description="one entry per rank: its worst outcome over all trials")
    wall_s: float
    sandbox: SandboxInfo
    warnings: list[str] = []
    notes: list[str] = Field([], description="what was built for the run (load_inline extensions)")
    static_report: StaticReport | None = None


class TimingStats(BaseModel):
    median_ms: float = Field(
        description="median over timed calls of the slowest rank's time; with several placements, "
        "the median of the placements' medians; with several jobs, the median of the jobs' medians"
    )
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    samples: int
    stop_reason: str
    sampled_ms: float = Field(0.0, description="real time spent sampling (the slowest rank's)")
    warmup_calls: int
    input_sets: int = Field(description="distinct input sets rotated through (L2 defeat)")
    clock: str
    wall_median_ms: float = Field(description="host wall-clock median of the same region (cross-check)")
    placements: int = Field(
        1,
        description="sampling rounds in each job, each with the inputs and the solution's memory at "
        "other addresses",
    )
    placement_spread: float | None = Field(
        None,
        description="standard deviation of log(median) between placements (0.01 = 1%), averaged over "
        "jobs; null with one placement",
    )
    jobs: int = Field(1, description="separate jobs (sets of processes) this side was timed in")
    job_spread: float | None = Field(
        None,
        description="standard deviation of log(median) between those jobs (0.01 = 1%); null with one job",
    )


class Ceilings(BaseModel):
    nvlink_gbps: float = Field(description="peer copy bandwidth per GPU, one direction, GB/s")
    hbm_gbps: float = Field(description="HBM copy bandwidth counting read + write, GB/s")
    tflops: dict[str, float] = Field(description="peak rate per dtype, TFLOP/s")
    round_latency_us: float = Field(description="cost of one dependent communication step")
    source: str


class RooflineResult(BaseModel):
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
    floor_ms: float = Field(description="max(nvlink, hbm, compute) + latency")
    bound: str
    time_ms: float | None = None
    pct_of_floor: float | None = Field(None, description="floor / time x 100: 100% is the speed of light")
    note: str = ""


class BenchResult(BaseModel):
    problem_id: int
    problem: str
    world_size: int
    size: str
    device: str
    verdict: BenchVerdict = Field(
        description="pass; fail; timeout; suspect: every output right but the candidate's time is below "
        "the physical floor (below_floor), so its speedup is not credited"
    )
    message: str
    reference: TimingStats | None = None
    candidate: TimingStats | None = None
    speedup: float | None = Field(None, description="reference median / candidate median")
    speedup_low: float | None = Field(None, description="reference q1 / candidate q3")
    speedup_high: float | None = Field(None, description="reference q3 / candidate q1")
    roofline: RooflineResult | None = None
    below_floor: bool = Field(
        False, description="the candidate's median is below the roofline floor: the time is not credited"
    )
    within_noise: bool | None = Field(
        None,
        description="on GPUs: the speedup is within the spread of identical code between runs (about "
        "5%), so it is no evidence of a difference",
    )
    ranks: list[RankResult] = []
    wall_s: float
    sandbox: SandboxInfo
    warnings: list[str] = []
    notes: list[str] = Field([], description="what was built for the run (load_inline extensions)")
    static_report: StaticReport | None = None


class Calibration(BaseModel):
    ceilings: Ceilings
    details: dict[str, Any] = Field(description="every measurement behind the ceilings")
    saved_to: str | None = Field(default=None, description="the calibration file the roofline now reads")
