"""The data that crosses the boundary between the host and the sandbox, each defined once (stdlib only).

The host (pkb_mcp/launches.py) writes a `LaunchConfig` for the launcher (harness/launch.py), which hands
each rank its `RankConfig`; a benchmark's `TimingConfig` rides in it. Rank 0 writes a `TimingRecord`
(timing.json) and the launcher a `LaunchRecord` (launch.json). These are JSON on the wire: the host
reads them back with size limits and treats every value as untrusted (docs/sandbox.md); the types say
what each side may rely on when the other is honest, and let mypy check both sides against one
definition.
"""

from __future__ import annotations

from typing import Any, TypedDict


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


class LaunchConfig(TypedDict):
    """One start of a problem's ranks: what the host writes for the launcher."""

    mode: str  # "outputs", "benchmark" or "profile"
    launch_dir: str
    problem_path: str
    solution_path: str
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
    rank_cpus: list[list[int]]


class RankConfig(LaunchConfig):
    """What one rank gets: the launch, and its rank."""

    rank: int


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
    launch_samples: list[int]  # pooled on the host: each launch's sample count


class RankRecord(TypedDict, total=False):
    """How one rank ended, as the launcher saw it."""

    rank: int
    state: str  # ok, error, crashed, timeout, aborted, exited
    exit_code: int | None
    signal: str | None
    error: str
    stage: str
    traceback: str
    elapsed_s: float
    cpus: list[int] | None
    stages: dict[str, float] | None


class LaunchRecord(TypedDict):
    """launch.json: every rank's outcome, the launch's wall time, and whether its deadline passed."""

    ranks: list[RankRecord]
    wall_s: float
    timed_out: bool
