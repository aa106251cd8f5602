"""The records of a `pkb eval` batch: the settings, one result per file with its outcome, the summary,
the published table and the report, shared by the batch (pkb_mcp/evaluation/batch.py), its store, its
table (pkb_mcp/evaluation/table.py) and its report formats (pkb_mcp/evaluation/report.py)."""

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
    variant: str = Field(
        "pkb", description="the workload: pkb's or the original benchmark's (docs/variants.md)"
    )
    trials: int = 5
    timeout_s: float = Field(120.0, description="limit of each check job")
    bench_timeout_s: float = Field(300.0, description="limit of each benchmark job")
    sandbox: str = "auto"
    convention: str = "auto"
    bench: bool = True
    unseen: bool = Field(True, description="each check also runs one trial at a size it was never shown")


class FileResult(BaseModel):
    file: str
    sha256: str
    problem_id: int | None = None
    problem: str | None = None
    variant: str = Field("pkb", description="the workload the file ran against: pkb's or the original's")
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
    original_correct: bool | None = Field(
        None,
        description="original variant: correct by the original benchmark's rules (correct, or failed only "
        "by pkb's protections); None in the pkb variant",
    )
    protections: list[str] = Field(
        default_factory=list,
        description="the protections of pkb's that failed a file correct by the original's rules",
    )
    message: str = ""
    generalizes: Literal["yes", "no"] | None = Field(
        None, description="a correct file also matched the reference at a size it was never shown"
    )
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
    attempt: int = Field(
        0, description="which attempt of the set the file is (pkb eval --attempts: the index of its path)"
    )


def is_fast(result: FileResult, p: float) -> bool:
    """Correct with a credited speedup above p: what fast_p counts, for a file and for a problem."""
    return result.correct and result.credited and result.speedup is not None and result.speedup > p


class EvalSummary(BaseModel):
    files: int
    attempted: int = Field(description="files run to a verdict: not skipped, no environment error")
    correct: int
    correct_pct: float | None
    generalizes: int = Field(0, description="correct files that also matched at a size never shown")
    generalization_judged: int = Field(0, description="correct files judged at a size never shown")
    fast_p: dict[str, float | None] = Field(description="threshold p -> fraction of attempted files")
    geomean_speedup: float | None = Field(description="over correct files with a credited speedup")
    outcomes: dict[str, int]


class TableRow(BaseModel):
    """One row of the published table: a category of one variant, or every category ("all")."""

    variant: str
    category: str = Field(description="the original benchmark's category (a problem's CATEGORY), or all")
    problems: int = Field(description="the suite's problems in the category: the denominator of every figure")
    with_files: int = Field(description="problems with a file in at least one attempt")
    unjudged: int = Field(
        description="problems with files, none of which reached a verdict (skipped or env) in any attempt"
    )
    correct: float = Field(description="problems with a correct file, per attempt (the mean over attempts)")
    fast_1: float | None = Field(
        description="problems with a correct file faster than the reference, per attempt (the mean); "
        "None without a benchmark"
    )
    best_correct: int = Field(description="problems with a correct file in at least one attempt (best of k)")
    best_fast_1: int | None = Field(
        description="problems with a correct, faster file in at least one attempt (best of k)"
    )
    original_correct: float | None = Field(
        None,
        description="original variant: problems with a file correct by the original benchmark's rules, per "
        "attempt (the mean); None in the pkb variant. Less `correct`: the problems pkb's protections fail",
    )
    best_original_correct: int | None = Field(
        None, description="original variant: problems correct by the original's rules in at least one attempt"
    )


class PublishedTable(BaseModel):
    """What the original benchmark's paper reports, per category and overall, by variant
    (docs/measurement.md, "The published table")."""

    attempts: int = Field(description="k: the attempts of the whole set (pkb eval --attempts)")
    variants: list[str]
    rows: list[TableRow]
    repeated: list[str] = Field(
        default_factory=list,
        description="problems with more than one file in one attempt: each counts once, by its best file",
    )
    without_exchange: dict[str, dict[int, str]] = Field(
        default_factory=dict,
        description="variant -> the problems whose workload a solution that communicates nothing passes, "
        "with the file's reason; each such variant has a row over the rest (ALL_THAT_COMMUNICATE)",
    )


class EvalReport(BaseModel):
    settings: EvalSettings
    store: str
    wall_s: float
    resumed: int = Field(description="files whose result came from an earlier run")
    results: list[FileResult]
    summary: EvalSummary
    table: PublishedTable | None = Field(None, description="the published table: per category, best of k")
    reports: dict[str, str] = Field(default_factory=dict, description="format -> path written")
    notes: list[str] = Field(default_factory=list)
