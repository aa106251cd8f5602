"""The records of an agent run: one attempt's (`attempt.json`, pkb's own, and `result.json`, a subset
of Harbor's trial result), the run's settings (`config.json`) and its result (`result.json`, with
pass@k). Shared by the attempt (pkb_mcp/agents/attempt.py), the run (pkb_mcp/agents/run.py) and its
scores (pkb_mcp/agents/scores.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

AttemptStatus = Literal["done", "no_tools", "agent_timeout", "agent_error", "no_file"]
# done: the client ended by itself and left solution.py; no_tools: its client never had pkb's tools
# (counted apart, never as the model's failure); agent_timeout: killed at the wall limit;
# agent_error: the client could not start or ended with an error before writing any file; no_file:
# it ended by itself without solution.py

Cause = Literal[
    "correct",
    "syntax",
    "shape",
    "runtime",
    "mismatch",
    "deadlock",
    "build",
    "suspect",
    "refused",
    "no_tools",
    "agent_timeout",
    "agent_error",
    "no_file",
    "unjudged",
]
# an attempt's cause in the paper's words (syntax, shape, runtime, mismatch, deadlock), and pkb's
# own: a failed build, a suspect (caught by pkb's protections), a file pkb refused to run as written
# (NVLink multicast, a convention it cannot bridge), and the attempt's own statuses; defined in
# docs/measurement.md, "Agent runs"


class Usage(BaseModel):
    """What the client spent, read from its transcript (pkb_mcp/agents/clients.py); None: the client
    does not say."""

    turns: int | None = None
    tool_calls: int = Field(0, description="every tool call the agent made (pkb's, the shell, files)")
    pkb_calls: int = Field(0, description="calls of pkb's tools (or, with --tools cli, pkb commands)")
    input_tokens: int | None = None
    cached_tokens: int | None = Field(None, description="input tokens read from the provider's cache")
    output_tokens: int | None = None
    cost_usd: float | None = None


class Snapshot(BaseModel):
    """The candidate as it was at one run_correctness or benchmark call the agent made, and what pkb
    answered then (in the loop, not the final judgment)."""

    index: int = Field(description="the call's place among the attempt's check and bench calls, from 0")
    kind: Literal["check", "bench"]
    at_s: float = Field(description="seconds since the attempt started")
    step: int = Field(description="tool calls the agent had made by this one, itself included")
    sha256: str
    file: str = Field(description="the snapshot, relative to the attempt's folder")
    passed: bool | None = Field(None, description="check: passed; bench: its check part passed")
    speedup: float | None = Field(None, description="bench: the credited speedup, where there was one")


class Preflight(BaseModel):
    """Whether the client had pkb's tools before its first model call (docs/agents.md, "Preflight")."""

    ok: bool
    how: str = Field(description="what showed it: the client's own report, or pkb's server being listed")
    tools: list[str] = Field(default_factory=list, description="pkb's tools the client listed")
    message: str = ""


class AttemptRecord(BaseModel):
    """One attempt of one problem by one agent: `attempt.json` in its folder, written last (a folder
    without it is run again on resume)."""

    problem_id: int
    problem: str
    attempt: int = Field(description="from 0")
    agent: str
    agent_version: str | None = None
    model: str | None = None
    tools: Literal["mcp", "cli"] = "mcp"
    agent_sandbox: Literal["docker", "none"] = Field(
        description="where the client ran: a container of its own, or as the user (no isolation)"
    )
    status: AttemptStatus
    message: str = ""
    started_at: str = Field(description="ISO 8601, UTC")
    finished_at: str
    wall_s: float
    exit_code: int | None = None
    preflight: Preflight
    usage: Usage = Field(default_factory=Usage)
    solution: str | None = Field(None, description="the collected file, relative to the attempt's folder")
    solution_sha256: str | None = None
    snapshots: list[Snapshot] = Field(default_factory=list)
    leftovers: list[str] = Field(
        default_factory=list, description="what was still running after the attempt ended and was killed"
    )


class AgentSettings(BaseModel):
    """A run's settings: `config.json` of its folder. A resumed run must have the same."""

    agent: str
    model: str | None = None
    problems: list[int]
    attempts: int
    variant: str = "pkb"
    world_size: int = 4
    size: str = "pkb"
    device: str = "cpu"
    tools: Literal["mcp", "cli"] = "mcp"
    agent_sandbox: Literal["docker", "none"] = "docker"
    max_turns: int | None = None
    max_usd: float | None = None
    wall_s: float = 1800.0
    concurrency: int = 1


class ProblemScore(BaseModel):
    """One problem over its attempts."""

    problem_id: int
    problem: str
    category: str
    attempts: int = Field(description="attempts run (n)")
    correct: int = Field(description="attempts judged correct (c)")
    fast_1: int = Field(description="attempts judged correct and faster than the reference")
    counted: int = Field(description="attempts that count (not no_tools): the n of pass@k")
    causes: dict[str, int] = Field(description="cause -> attempts")
    best_speedup: float | None = None
    cost_usd: float | None = Field(None, description="over its attempts, where the client says")
    wall_s: float


class StepPoint(BaseModel):
    """Correct against steps: the share of problems with a correct (and a fast) candidate by the time
    the agent had spent `steps` tool calls, from the snapshots."""

    steps: int
    correct: float
    fast_1: float


class RunScores(BaseModel):
    problems: list[ProblemScore]
    pass_at_k: dict[str, float | None] = Field(description="k -> unbiased pass@k over the problems")
    fast_1_at_k: dict[str, float | None]
    estimated: dict[str, int] = Field(
        default_factory=dict,
        description="k -> problems with at least k counted attempts, where pass@k is the unbiased "
        "estimate (the others count by their best of n, a lower bound)",
    )
    fast_p: float = Field(1.0, description="the speedup fast_1_at_k and the step curve's fast_1 must exceed")
    solved: int = Field(0, description="problems with a correct counted attempt (best of k)")
    no_tools: int = Field(description="attempts whose client never had pkb's tools: counted apart")
    causes: dict[str, int]
    cost_usd: float | None = None
    cost_attempts: int = Field(0, description="attempts whose client reported a cost: cost_usd sums theirs")
    cost_per_solved_usd: float | None = None
    wall_s: float
    wall_per_solved_s: float | None = None
    steps: list[StepPoint] = Field(default_factory=list)


class RunResult(BaseModel):
    """A run's `result.json`: its settings, scores and where the reports are."""

    settings: AgentSettings
    started_at: str
    finished_at: str
    attempts_run: int = Field(description="attempts this invocation ran (the others were resumed)")
    attempts_resumed: int
    scores: RunScores
    pass_at_k: dict[str, float | None] = Field(description="the same as scores.pass_at_k, as Harbor names it")
    reports: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
