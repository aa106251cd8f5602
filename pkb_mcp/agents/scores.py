"""The scores of an agent run (definitions: docs/measurement.md, "Agent runs"): per problem over its
attempts, pass@k and fast_1@k with the unbiased estimator, each attempt's cause in the paper's words
and pkb's, cost and wall time per problem solved, and correct against steps from the snapshots.

The verdicts are `pkb eval`'s of the collected files (pkb_mcp/agents/run.py); an attempt whose client
never had pkb's tools (`no_tools`) is counted apart: it is neither in n nor in c.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pkb_mcp.agents.records import AttemptRecord, Cause, ProblemScore, RunScores, StepPoint
from pkb_mcp.evaluation.records import FileResult, is_fast
from pkb_mcp.evaluation.report import NO_MATPLOTLIB

FAST_P = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c are right: 1 - C(n-c, k) / C(n, k),
    as a product (no large binomials). k > n is not estimable: the caller keeps k <= n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def cause(record: AttemptRecord, result: FileResult | None) -> Cause:
    """An attempt's cause: the attempt's own status where it left nothing judged, else the judged file's
    (pkb eval's outcome, and for a failed run what its message says)."""
    if record.status == "no_tools":
        return "no_tools"
    if result is None:
        if record.status in ("agent_timeout", "agent_error", "no_file"):
            return record.status
        return "no_file" if record.solution is None else "unjudged"
    if result.correct:
        return "correct"
    message = result.message
    if result.outcome == "build":
        return "build"
    if result.outcome == "refused" or "suspect" in message.lower():
        return "suspect"
    if result.outcome == "timeout":
        return "deadlock"
    if "SyntaxError" in message or "IndentationError" in message:
        return "syntax"
    if result.outcome == "wrong":
        return "shape" if ", expected " in message or "shape" in message else "mismatch"
    if result.outcome == "error":
        return "runtime"
    return "unjudged"


def _ks(n: int) -> list[int]:
    ks, k = [1], 2
    while k < n:
        ks.append(k)
        k *= 2
    return sorted({*ks, n})


def score(
    records: list[AttemptRecord],
    results: dict[tuple[int, int], FileResult],
    categories: dict[int, str],
    ks: list[int] | None = None,
) -> RunScores:
    """The run's scores over its problems (every problem of `categories`, attempted or not)."""
    by_problem: dict[int, list[AttemptRecord]] = {pid: [] for pid in categories}
    for r in records:
        by_problem.setdefault(r.problem_id, []).append(r)
    problems = []
    all_causes: Counter[str] = Counter()
    for pid, attempts in sorted(by_problem.items()):
        causes = Counter(cause(r, results.get((pid, r.attempt))) for r in attempts)
        all_causes.update(causes)
        judged = [results.get((pid, r.attempt)) for r in attempts if r.status != "no_tools"]
        right = [j for j in judged if j is not None and j.correct]
        costs = [r.usage.cost_usd for r in attempts if r.usage.cost_usd is not None]
        speeds = [j.speedup for j in right if j.credited and j.speedup is not None]
        problems.append(
            ProblemScore(
                problem_id=pid,
                problem=attempts[0].problem if attempts else str(pid),
                category=categories.get(pid, ""),
                attempts=len(attempts),
                correct=len(right),
                fast_1=sum(1 for j in right if is_fast(j, FAST_P)),
                counted=len(judged),
                causes=dict(causes),
                best_speedup=max(speeds) if speeds else None,
                cost_usd=sum(costs) if costs else None,
                wall_s=round(sum(r.wall_s for r in attempts), 3),
            )
        )
    most = max((p.counted for p in problems), default=0)
    pass_k: dict[str, float | None] = {}
    fast_k: dict[str, float | None] = {}
    for k in ks or _ks(max(most, 1)):
        # a problem with fewer counted attempts than k is not estimable at k: it counts as 0 there
        pass_k[str(k)] = _mean(
            [pass_at_k(p.counted, p.correct, k) if p.counted >= k else 0.0 for p in problems]
        )
        fast_k[str(k)] = _mean(
            [pass_at_k(p.counted, p.fast_1, k) if p.counted >= k else 0.0 for p in problems]
        )
    costs = [p.cost_usd for p in problems if p.cost_usd is not None]
    cost = sum(costs) if costs else None
    solved = sum(1 for p in problems if p.correct)
    wall = round(sum(p.wall_s for p in problems), 3)
    return RunScores(
        problems=problems,
        pass_at_k=pass_k,
        fast_1_at_k=fast_k,
        no_tools=all_causes.get("no_tools", 0),
        causes=dict(all_causes),
        cost_usd=cost,
        cost_per_solved_usd=cost / solved if cost is not None and solved else None,
        wall_s=wall,
        wall_per_solved_s=wall / solved if solved else None,
        steps=step_curve(records, len(problems)),
    )


def _at(n: int, c: int, k: int) -> float:
    return pass_at_k(n, c, k) if n >= k else 0.0


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def step_curve(records: list[AttemptRecord], n_problems: int) -> list[StepPoint]:
    """Correct against steps: for each number of tool calls s, the mean over attempt indices of the
    share of the run's problems whose attempt of that index had, by step s, a check that passed
    (correct) and a benchmark with a credited speedup above 1 (fast_1), from the snapshots (pkb's
    answers in the loop). A per-attempt curve of the agent: where it stops gaining is its plateau."""
    counted = [r for r in records if r.status != "no_tools"]
    if not counted or not n_problems:
        return []
    last = max((s.step for r in counted for s in r.snapshots), default=0)
    last = max(last, max(r.usage.tool_calls for r in counted))
    indices = sorted({r.attempt for r in counted})
    points = []
    for step in range(last + 1):
        correct = fast = 0.0
        for k in indices:
            mine = [r for r in counted if r.attempt == k]
            correct += sum(any(s.passed and s.step <= step for s in r.snapshots) for r in mine) / n_problems
            fast += (
                sum(any((s.speedup or 0) > FAST_P and s.step <= step for s in r.snapshots) for r in mine)
                / n_problems
            )
        points.append(StepPoint(steps=step, correct=correct / len(indices), fast_1=fast / len(indices)))
    return points


def to_markdown(s: RunScores) -> list[str]:
    lines = ["| k | pass@k | fast_1@k |", "| --- | --- | --- |"]
    for k, value in s.pass_at_k.items():
        fast = s.fast_1_at_k.get(k)
        lines.append(f"| {k} | {_pct(value)} | {_pct(fast)} |")
    lines += ["", "| problem | category | attempts | correct | fast_1 | best speedup | causes |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for p in s.problems:
        best = f"{p.best_speedup:.2f}x" if p.best_speedup is not None else ""
        said = ", ".join(f"{k} {v}" for k, v in sorted(p.causes.items()))
        lines.append(
            f"| {p.problem_id} {p.problem} | {p.category} | {p.attempts} | {p.correct} | {p.fast_1} "
            f"| {best} | {said} |"
        )
    lines += ["", "causes: " + ", ".join(f"{k} {v}" for k, v in sorted(s.causes.items()))]
    if s.no_tools:
        lines.append(f"{s.no_tools} attempt(s) never had pkb's tools (no_tools): counted apart")
    cost = f"${s.cost_usd:.2f}" if s.cost_usd is not None else "not reported by the client"
    per = f", ${s.cost_per_solved_usd:.2f} per problem solved" if s.cost_per_solved_usd is not None else ""
    wall = f", {s.wall_per_solved_s:.0f} s per problem solved" if s.wall_per_solved_s is not None else ""
    lines.append(f"cost {cost}{per}; wall {s.wall_s:.0f} s{wall}")
    if s.steps:
        lines += ["", "| tool calls | correct | fast_1 |", "| --- | --- | --- |"]
        shown = {q.steps for q in s.steps if q.steps in (0, 1, 2, 5) or q.steps % 10 == 0}
        shown.add(s.steps[-1].steps)
        for q in s.steps:
            if q.steps in shown:
                lines.append(f"| {q.steps} | {_pct(q.correct)} | {_pct(q.fast_1)} |")
    lines.append('\nDefinitions: docs/measurement.md, "Agent runs".')
    return lines


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def write_steps_png(points: list[StepPoint], path: Path) -> str | None:
    """Correct and fast_1 against tool calls; None, or why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [p.steps for p in points]
    ax.step(xs, [p.correct for p in points], where="post", label="correct")
    ax.step(xs, [p.fast_1 for p in points], where="post", label="fast_1")
    ax.set_xlabel("tool calls spent")
    ax.set_ylabel("share of problems")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("correct against steps (mean over attempts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
