"""The scores of an agent run: per problem over its attempts, pass@k and fast_1@k with the unbiased
estimator, every attempt's cause (the paper's words and pkb's), cost and wall time per problem solved,
and correct against steps from the snapshots. The definitions are in docs/measurement.md ("Agent
runs"); the records are pkb_mcp/agents/records.py.

The verdicts are `pkb eval`'s of the collected files (pkb_mcp/agents/run.py judges them, attempt K of
problem P being file P of attempt set K; its published table is the per-category one). An attempt
whose client never had pkb's tools (`no_tools`) is counted apart: in no n, no c and no step curve.
A cause is read from the judged file's outcome and, for a failure, from the words pkb's judge writes
(the phrases below, each named with the module that writes it). Everything here is a pure function
of the records but `write_steps_png`, which needs matplotlib (an optional extra, as for `pkb eval`'s
PNG). May import: agents.records, evaluation.records, evaluation.report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import get_args

from pkb_mcp.agents.records import AttemptRecord, Cause, ProblemScore, RunScores, StepPoint
from pkb_mcp.evaluation.records import NOT_ATTEMPTED, FileResult, is_fast
from pkb_mcp.evaluation.report import NO_MATPLOTLIB

Results = Mapping[tuple[int, int], FileResult]  # (problem id, attempt) -> the judged file

# The paper's words first, then pkb's, then the attempt's own: the order of every causes table.
CAUSES: tuple[Cause, ...] = get_args(Cause)

# What pkb writes where a file does not parse or is no candidate (pkb_mcp/runs/run.py, read_solution),
# or where Python raised it while importing (the rank's message: "raised SyntaxError: ...").
SYNTAX = (
    "the solution does not parse: ",
    " defines no solution(): ",
    "raised SyntaxError",
    "raised IndentationError",
    "raised TabError",
)
# pkb's protections: what it writes where a file's outputs or times are not what they seem.
SUSPECT = (
    "shares memory with an input",  # aliasing (runs/judge.py)
    "was changed by the solution; inputs are read-only",  # mutation (runs/judge.py)
    "changed its inputs while being timed",  # mutation while timed (runs/verdicts.py)
    "altered after the harness wrote it",  # a forged output file or timing record (runs/verdicts.py)
    "left no readable timing record",  # (runs/verdicts.py)
    "differs from the judged output of the same inputs",  # timed outputs (runs/verdicts.py)
    "the solution replaced ",  # the tamper check (harness/worker.py)
)
FRESH = "wrong on a fresh input set"  # fresh inputs (runs/benchmark.py): suspect where the outputs
# were wrong, not where a rank raised or crashed there
NOT_CREDITED = "not credited: "  # a benchmark's verdict `suspect` (runs/verdicts.py): below the floor,
# or much faster on input sets it has seen
UNREADABLE = "unreadable output: "  # an output file the host could not read (runs/verdicts.py)
# the harness wrote a file larger than the expected outputs: other shapes, dtypes or more tensors
# (pkb_mcp/launches.py)
BIGGER = "more than outputs of the expected shapes take"
TENSOR_DIFFERS = re.compile(r"\bis \w+\[[\d, ]*\], expected \w+\[")  # "output 0 is float16[4], expected
# bfloat16[4]" (runs/judge.py, and harness/tensorfile.py for a header)
COUNT_DIFFERS = "tensors, expected "  # "the output holds 2 tensors, expected 1" (harness/tensorfile.py)
VALUES_DIFFER = (" elements differ; first at ", "relative error norm ")  # runs/judge.py
STRUCTURE_DIFFERS = re.compile(r": expected (\S+).*?, got (\S+)")  # "output 1: expected int 3, got int
# 4", "the output: expected tensor, got None" (harness/structure.py)
SCALARS = ("int", "float", "bool", "str")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c are right: 1 - C(n-c, k) / C(n, k),
    the chance that k of the n drawn without replacement hold a right one (Chen et al., 2021),
    computed as 1 - prod over i in (n-c, n] of (1 - k/i), with no large binomial.

    Edge cases: c = 0 gives 0; n - c < k (every draw of k holds a right one) gives 1, so k = n is
    1 when c > 0; k = 1 is c / n. k > n is not estimable from n samples and, like k < 1 or c outside
    0..n, raises ValueError (`score` counts such a problem by its best of n instead)."""
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n >= 1 and 0 <= c <= n (n={n}, c={c})")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n: {n} samples say nothing of k = {k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def judged(result: FileResult | None) -> bool:
    """Whether a file reached a verdict (neither skipped nor stopped by the harness or environment)."""
    return result is not None and result.outcome not in NOT_ATTEMPTED


def cause(record: AttemptRecord, result: FileResult | None) -> Cause:
    """An attempt's cause (docs/measurement.md, "Agent runs"): `no_tools` whatever it left; a judged
    correct file's `correct` (or `suspect`, where its benchmark's time was not credited as suspect);
    then the attempt's own status (`agent_timeout`, `agent_error`, `no_file`) over its file's
    failure; then the judged file's: `build`, `deadlock` (timed out), `suspect` (one of pkb's
    protections caught it), `refused` (pkb would not run it as written), `syntax`, `shape`,
    `mismatch` (wrong values) or `runtime` (it raised, crashed or exited); `unjudged` where nothing
    was judged (no result, skipped, an environment error)."""
    if record.status == "no_tools":
        return "no_tools"
    if judged(result) and result is not None and result.correct:
        return "suspect" if result.message.startswith(NOT_CREDITED) else "correct"
    if record.status in ("agent_timeout", "agent_error", "no_file"):
        return record.status
    if result is None or not judged(result):
        return "unjudged"
    message = result.message
    if result.outcome == "build":
        return "build"
    if result.outcome == "timeout":
        return "deadlock"
    unreadable = UNREADABLE in message and BIGGER not in message
    fresh = result.outcome == "wrong" and FRESH in message
    if result.protections or unreadable or fresh or any(s in message for s in SUSPECT):
        return "suspect"
    if result.outcome == "refused":
        return "refused"
    if any(s in message for s in SYNTAX):
        return "syntax"
    if result.outcome == "wrong":
        return "shape" if _shape(message) else "mismatch"
    return "runtime"


def _shape(message: str) -> bool:
    """Whether a `wrong` file's message says an output's shape, dtype, count or nesting differs (not
    its values)."""
    if any(s in message for s in VALUES_DIFFER):
        return False
    if BIGGER in message or TENSOR_DIFFERS.search(message) or COUNT_DIFFERS in message:
        return True
    found = STRUCTURE_DIFFERS.search(message)
    if found is None:
        return False
    want, got = found.group(1), found.group(2)
    return not (want == got and want in SCALARS)  # a number or a string of another value: a mismatch


def default_ks(attempts: int) -> list[int]:
    """1, every power of two below `attempts`, and `attempts`."""
    ks = {1, max(1, attempts)}
    k = 2
    while k < attempts:
        ks.add(k)
        k *= 2
    return sorted(ks)


def _at_k(n: int, c: int, k: int) -> float:
    """A problem's pass@k: the estimator where it has k counted attempts, else its best of n."""
    return pass_at_k(n, c, k) if k <= n else float(c > 0)


def score(
    records: list[AttemptRecord],
    results: Results,
    categories: Mapping[int, str],
    ks: list[int] | None = None,
    fast_p: float = 1.0,
) -> RunScores:
    """The run's scores over its problems: those of `categories` (problem id -> category; each one
    listed, attempted or not) and any a record names; pass@k and fast_1@k are over those with a
    counted attempt. `results`: the judged files by (problem id, attempt); `ks`: default 1, the
    powers of two below the most counted attempts, and that number; `fast_p`: the speedup fast_1@k
    and the step curve's fast count above (1: faster than the reference)."""
    by_problem: dict[int, list[AttemptRecord]] = {pid: [] for pid in categories}
    for r in records:
        by_problem.setdefault(r.problem_id, []).append(r)
    problems: list[ProblemScore] = []
    causes: Counter[str] = Counter()
    spent: list[float] = []
    for pid, attempts in sorted(by_problem.items()):
        mine = Counter(cause(r, results.get((pid, r.attempt))) for r in attempts)
        causes.update(mine)
        counted = [results.get((pid, r.attempt)) for r in attempts if r.status != "no_tools"]
        right = [j for j in counted if j is not None and judged(j) and j.correct]
        speeds = [j.speedup for j in right if j.credited and j.speedup is not None]
        costs = [r.usage.cost_usd for r in attempts if r.usage.cost_usd is not None]
        spent += costs
        name = next((r.problem for r in attempts), "") or next(
            (j.problem for (p, _), j in results.items() if p == pid and j.problem), ""
        )
        problems.append(
            ProblemScore(
                problem_id=pid,
                problem=name or "",
                category=categories.get(pid, ""),
                attempts=len(attempts),
                correct=len(right),
                fast_1=sum(is_fast(j, fast_p) for j in right),
                counted=len(counted),
                causes={c: mine[c] for c in CAUSES if mine[c]},
                best_speedup=max(speeds) if speeds else None,
                cost_usd=sum(costs) if costs else None,
                wall_s=sum(r.wall_s for r in attempts),
            )
        )
    scored = [p for p in problems if p.counted]
    pass_k: dict[str, float | None] = {}
    fast_k: dict[str, float | None] = {}
    estimated: dict[str, int] = {}
    for k in ks or default_ks(max((p.counted for p in scored), default=1)):
        key = str(k)
        estimated[key] = sum(p.counted >= k for p in scored)
        pass_k[key] = _mean([_at_k(p.counted, p.correct, k) for p in scored])
        fast_k[key] = _mean([_at_k(p.counted, p.fast_1, k) for p in scored])
    solved = sum(p.correct > 0 for p in problems)
    cost = sum(spent) if spent else None
    wall = sum(p.wall_s for p in problems)
    return RunScores(
        problems=problems,
        pass_at_k=pass_k,
        fast_1_at_k=fast_k,
        estimated=estimated,
        fast_p=fast_p,
        solved=solved,
        no_tools=causes["no_tools"],
        causes={c: causes[c] for c in CAUSES if causes[c]},
        cost_usd=cost,
        cost_attempts=len(spent),
        cost_per_solved_usd=cost / solved if cost is not None and solved else None,
        wall_s=wall,
        wall_per_solved_s=wall / solved if solved else None,
        steps=step_curve(records, results, fast_p=fast_p),
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _by_step(
    record: AttemptRecord, result: FileResult | None, fast_p: float
) -> tuple[int | None, int | None]:
    """The first step at which an attempt had a snapshot that passed, and one that was fast (None:
    never). A snapshot of the very bytes that were judged takes the judgment's verdict, not the loop's."""
    first_correct: int | None = None
    first_fast: int | None = None
    same = result if judged(result) else None
    for s in record.snapshots:
        if same is not None and s.sha256 == same.sha256:
            right, fast = same.correct, is_fast(same, fast_p)
        else:
            right, fast = bool(s.passed), bool(s.passed) and s.speedup is not None and s.speedup > fast_p
        if right and (first_correct is None or s.step < first_correct):
            first_correct = s.step
        if fast and (first_fast is None or s.step < first_fast):
            first_fast = s.step
    return first_correct, first_fast


def step_curve(
    records: list[AttemptRecord], results: Results, max_steps: int | None = None, *, fast_p: float = 1.0
) -> list[StepPoint]:
    """Correct against steps, for s = 0 .. `max_steps` (default: the most tool calls a counted attempt
    made, or the latest snapshot's step). For attempt index a, the share of the problems with a
    counted attempt a whose attempt had, within its first s tool calls (a snapshot's step counts its
    own call), a check or benchmark that passed (correct) or a benchmark with a credited speedup above
    `fast_p` (fast_1); each point is the mean of these shares over the attempt indices: a per-attempt
    curve of the agent, whose last point is its loop's pass@1. A snapshot with the bytes of the judged
    file (`results`) takes the judgment; the others, pkb's answers in the loop. [] when no attempt
    counts."""
    counted = [r for r in records if r.status != "no_tools"]
    if not counted:
        return []
    last = max(max([r.usage.tool_calls, *(s.step for s in r.snapshots)]) for r in counted)
    top = last if max_steps is None else max_steps
    firsts: dict[int, list[tuple[int | None, int | None]]] = {}
    for r in counted:
        firsts.setdefault(r.attempt, []).append(_by_step(r, results.get((r.problem_id, r.attempt)), fast_p))
    points = []
    for s in range(top + 1):
        right = [sum(c is not None and c <= s for c, _ in each) / len(each) for each in firsts.values()]
        fast = [sum(f is not None and f <= s for _, f in each) / len(each) for each in firsts.values()]
        points.append(StepPoint(steps=s, correct=sum(right) / len(right), fast_1=sum(fast) / len(fast)))
    return points


def reached(points: list[StepPoint], fraction: float) -> int | None:
    """The fewest tool calls at which the correct share reaches `fraction` of its last value (None
    where it never rises above 0): where the curve's plateau begins, at fraction 0.9 say."""
    if not points or points[-1].correct <= 0:
        return None
    goal = fraction * points[-1].correct
    return next(p.steps for p in points if p.correct >= goal - 1e-12)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100.0 * value:.1f}%"


def _shown_steps(points: list[StepPoint]) -> list[StepPoint]:
    """The step table's rows: 1, 2, 5, 10, 20, 30, 50, 75, 100 and every 50 after, and the last."""
    if not points:
        return []
    last = points[-1].steps
    marks = {1, 2, 5, 10, 20, 30, 50, 75, *range(100, last + 1, 50), last}
    return [p for p in points if p.steps in marks]


def to_markdown(scores: RunScores) -> list[str]:
    """The scores' Markdown lines: pass@k and fast_1@k, the causes, cost and wall time per problem
    solved, each problem's row, and correct against steps at a few step counts."""
    fast = f"fast_{scores.fast_p:g}@k"
    lines = [
        f"| k | pass@k | {fast} | problems with k counted attempts |",
        "| --- | --- | --- | --- |",
    ]
    scored = sum(p.counted > 0 for p in scores.problems)
    for k, value in scores.pass_at_k.items():
        exact = scores.estimated.get(k)
        lines.append(
            f"| {k} | {_pct(value)} | {_pct(scores.fast_1_at_k.get(k))} | "
            f"{'' if exact is None else f'{exact} of {scored}'} |"
        )
    apart = (
        f" {scores.no_tools} attempt(s) never had pkb's tools (no_tools): counted apart."
        if scores.no_tools
        else ""
    )
    lines += [
        "",
        f"Over the {scored} problem(s) with a counted attempt; a problem with fewer than k counts by its "
        f"best of n.{apart}",
        "",
        "| cause | attempts |",
        "| --- | --- |",
    ]
    lines += [f"| {c} | {scores.causes[c]} |" for c in CAUSES if scores.causes.get(c)]
    attempts = sum(p.attempts for p in scores.problems)
    if scores.cost_usd is None:
        cost = "cost not reported by the client"
    else:
        per = scores.cost_per_solved_usd
        cost = f"cost ${scores.cost_usd:.2f} over the {scores.cost_attempts} of {attempts} attempt(s) that "
        cost += "report one" + ("" if per is None else f", ${per:.2f} per problem solved")
    per_s = scores.wall_per_solved_s
    wall = "" if per_s is None else f"; {per_s:.0f} s per problem solved"
    lines += [
        "",
        f"{scores.solved} problem(s) solved (a correct attempt); {cost}; wall {scores.wall_s:.0f} s "
        f"over the attempts{wall}.",
        "",
        "| problem | category | attempts | counted | correct | fast | best speedup | causes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in scores.problems:
        best = "" if p.best_speedup is None else f"{p.best_speedup:.2f}x"
        said = ", ".join(f"{c} {n}" for c, n in p.causes.items())
        lines.append(
            f"| {p.problem_id} {p.problem} | {p.category} | {p.attempts} | {p.counted} | {p.correct} | "
            f"{p.fast_1} | {best} | {said} |"
        )
    if scores.steps:
        half, most, full = (reached(scores.steps, f) for f in (0.5, 0.9, 1.0))
        lines += ["", "Correct against steps (the mean over attempts, from the snapshots):", ""]
        lines += ["| tool calls | correct | fast |", "| --- | --- | --- |"]
        lines += [f"| {p.steps} | {_pct(p.correct)} | {_pct(p.fast_1)} |" for p in _shown_steps(scores.steps)]
        if full is not None:
            lines += [
                "",
                f"The correct share reaches half its last value at {half} tool calls, 90% of it at {most} "
                f"and all of it at {full}.",
            ]
    lines += ["", 'Definitions: docs/measurement.md, "Agent runs".']
    return lines


def write_steps_png(points: list[StepPoint], path: Path) -> str | None:
    """Correct and fast against tool calls, with where 90% of the last correct share is reached;
    None, or why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    if not points:
        return "steps PNG not written: no attempt counts"
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [p.steps for p in points]
    ax.step(xs, [p.correct for p in points], where="post", label="correct")
    ax.step(xs, [p.fast_1 for p in points], where="post", label="fast")
    most = reached(points, 0.9)
    if most is not None:
        ax.axvline(most, color="gray", linestyle=":", linewidth=1, label=f"90% of the last correct: {most}")
    ax.set_xlabel("tool calls spent")
    ax.set_ylabel("share of problems (mean over attempts)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("correct against steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
