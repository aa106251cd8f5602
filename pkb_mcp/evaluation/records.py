"""The records of a `pkb eval` batch: the settings, one result per file with its outcome, the summary
and the report, shared by the batch (pkb_mcp/evaluation/batch.py), its store and its report formats
(pkb_mcp/evaluation/report.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Outcome = Literal["pass", "wrong", "error", "timeout", "build", "refused", "skipped", "env"]
# what the candidate did wrong; "skipped" (not run) and "env" (the harness or the environment failed)
# say nothing about the candidate
CANDIDATE_FAILURES = ("wrong", "error", "timeout", "build", "refused")
NOT_ATTEMPTED = ("skipped", "env")


class EvalSettings(BaseModel):
    world_size: int = 4
    device: str = "cpu"
    size: str = "pkb"
    trials: int = 5
    timeout_s: float = Field(120.0, description="limit of each check job")
    bench_timeout_s: float = Field(300.0, description="limit of each benchmark job")
    sandbox: str = "auto"
    convention: str = "auto"
    bench: bool = True


class FileResult(BaseModel):
    file: str
    sha256: str
    problem_id: int | None = None
    problem: str | None = None
    backend: str | None = Field(
        None, description="the last word of an original-format name (cuda, triton...)"
    )
    pairing: str | None = Field(
        None,
        description="how the file was paired with its problem where its name and id disagree (the name "
        "wins) or its name is no problem's (paired by the id)",
    )
    convention: str | None = Field(None, description="how solution() was called: ours or original")
    outcome: Outcome
    correct: bool = False
    message: str = ""
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    credited: bool = Field(False, description="the speedup counts in fast_p and the geometric mean")
    candidate_ms: float | None = None
    reference_ms: float | None = None
    floor_ms: float | None = Field(None, description="the roofline floor (GPU only)")
    pct_of_floor: float | None = None
    floor_speedup: float | None = Field(None, description="reference time / floor: the speedup at the floor")
    check_job: str | None = None
    bench_job: str | None = None
    reused: bool = Field(False, description="taken from an earlier run of the same file and settings")


class EvalSummary(BaseModel):
    files: int
    attempted: int = Field(description="files run to a verdict: not skipped, no environment error")
    correct: int
    correct_pct: float | None
    fast_p: dict[str, float | None] = Field(description="threshold p -> fraction of attempted files")
    geomean_speedup: float | None = Field(description="over correct files with a credited speedup")
    outcomes: dict[str, int]


class EvalReport(BaseModel):
    settings: EvalSettings
    store: str
    wall_s: float
    resumed: int = Field(description="files whose result came from an earlier run")
    results: list[FileResult]
    summary: EvalSummary
    reports: dict[str, str] = Field(default_factory=dict, description="format -> path written")
    notes: list[str] = Field(default_factory=list)
