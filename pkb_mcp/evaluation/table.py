"""The published table of a `pkb eval` batch: what the original benchmark's paper reports, per category
and overall, from the files' results (pkb_mcp/evaluation/records.py) alone.

For each variant and category: the suite's problems (every figure's denominator: a problem with no file,
or whose files never reached a verdict, is not correct), the problems correct, those correct and
faster than the reference (fast_1, in the meaning of the summary's fast_p: a credited speedup above 1),
and in the original variant those correct by the original benchmark's rules (the difference is what
pkb's protections fail: pkb_mcp/runs/protections.py); per attempt, as the mean over the attempts, and
as best of k (a problem counts when any attempt has it). The definitions are in docs/measurement.md
("The published table"). Everything here is a pure function of the records but `suite_categories`,
which reads the suite. May import: evaluation.records, root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pkb_mcp.evaluation.records import NOT_ATTEMPTED, FileResult, PublishedTable, TableRow, is_fast

ALL = "all"
ALL_THAT_COMMUNICATE = "all that must communicate"  # ALL less the problems passable without an exchange
DEFAULT_VARIANT = "pkb"
BY_ORIGINAL = "correct by the original's rules"


def suite_categories() -> dict[int, str]:
    """Problem id -> the original benchmark's category. A problem's CATEGORY is the original's
    (docs/problem-format.md), so no mapping is needed; were one needed, it would go here."""
    from pkb_mcp import problems

    return {pid: p.category for pid, p in problems.suite().items()}


def passable_without_exchange(variants: Iterable[str], world_size: int) -> dict[str, dict[int, str]]:
    """variant -> problem id -> why a solution that communicates nothing passes it at `world_size`
    (its file's PASSES_WITHOUT_EXCHANGE); variants without such problems are left out."""
    from pkb_mcp import problems

    out: dict[str, dict[int, str]] = {}
    for variant in variants:
        found = {
            pid: why for pid, p in problems.suite(variant).items() if (why := p.without_exchange(world_size))
        }
        if found:
            out[variant] = found
    return out


def variant_of(result: FileResult) -> str:
    """The variant a file ran in (docs/variants.md)."""
    return result.variant or DEFAULT_VARIANT


@dataclass
class _Standing:
    """A problem in one attempt of one variant, by its best file."""

    files: int = 0
    judged: bool = False
    correct: bool = False
    fast: bool = False
    original_correct: bool = False  # original variant: by the original benchmark's rules


def standings(results: Iterable[FileResult]) -> dict[tuple[str, int, int], _Standing]:
    """(variant, attempt, problem id) -> how the problem stands there: judged where a file reached a
    verdict, correct where a file is correct, fast where a file is correct and faster than the reference."""
    out: dict[tuple[str, int, int], _Standing] = {}
    for r in results:
        if r.problem_id is None:
            continue
        s = out.setdefault((variant_of(r), r.attempt, r.problem_id), _Standing())
        s.files += 1
        s.judged = s.judged or r.outcome not in NOT_ATTEMPTED
        s.correct = s.correct or r.correct
        s.fast = s.fast or is_fast(r, 1.0)
        # a file correct by pkb's rules is correct by the original's (runs/protections.py)
        s.original_correct = s.original_correct or r.correct or bool(r.original_correct)
    return out


def _row(
    variant: str,
    category: str,
    ids: list[int],
    attempts: int,
    benched: bool,
    by_problem: Mapping[tuple[str, int, int], _Standing],
) -> TableRow:
    def each(pid: int) -> list[_Standing]:
        return [s for a in range(attempts) if (s := by_problem.get((variant, a, pid))) is not None]

    per_problem = {pid: each(pid) for pid in ids}
    correct = sum(s.correct for ss in per_problem.values() for s in ss)
    fast = sum(s.fast for ss in per_problem.values() for s in ss)
    by_original = variant != DEFAULT_VARIANT  # the original's rules judge the original's workload only
    original = sum(s.original_correct for ss in per_problem.values() for s in ss)
    return TableRow(
        variant=variant,
        category=category,
        problems=len(ids),
        with_files=sum(bool(ss) for ss in per_problem.values()),
        unjudged=sum(bool(ss) and not any(s.judged for s in ss) for ss in per_problem.values()),
        correct=correct / attempts,
        fast_1=fast / attempts if benched else None,
        best_correct=sum(any(s.correct for s in ss) for ss in per_problem.values()),
        best_fast_1=sum(any(s.fast for s in ss) for ss in per_problem.values()) if benched else None,
        original_correct=original / attempts if by_original else None,
        best_original_correct=(
            sum(any(s.original_correct for s in ss) for ss in per_problem.values()) if by_original else None
        ),
    )


def published_table(
    results: list[FileResult],
    categories: Mapping[int, str],
    *,
    attempts: int | None = None,
    benched: bool = True,
    without_exchange: Mapping[str, Mapping[int, str]] | None = None,
) -> PublishedTable:
    """The table over the suite `categories` (problem id -> category): one row per category, in the
    order of their first problem, then the overall row, for each variant the results ran in (pkb
    first). `attempts`: k (default: the highest attempt index + 1); `benched`: False where no file was
    benchmarked (--no-bench), so fast_1 is unknown. `without_exchange` (variant -> problem id ->
    reason: `passable_without_exchange`): a variant with such problems gets a row over the others."""
    k = attempts if attempts is not None else 1 + max((r.attempt for r in results), default=0)
    by_problem = standings(r for r in results if r.problem_id in categories)
    found = {variant_of(r) for r in results}
    variants = sorted(found or {DEFAULT_VARIANT}, key=lambda v: (v != DEFAULT_VARIANT, v))
    groups: dict[str, list[int]] = {}
    for pid in sorted(categories):
        groups.setdefault(categories[pid], []).append(pid)
    rows = []
    for variant in variants:
        for category, ids in groups.items():
            rows.append(_row(variant, category, ids, k, benched, by_problem))
        rows.append(_row(variant, ALL, sorted(categories), k, benched, by_problem))
        passable = (without_exchange or {}).get(variant, {})
        if passable:
            rest = sorted(pid for pid in categories if pid not in passable)
            rows.append(_row(variant, ALL_THAT_COMMUNICATE, rest, k, benched, by_problem))
    repeated = [
        f"problem {pid}: {s.files} files in attempt {a + 1}" + (f" ({v})" if len(variants) > 1 else "")
        for (v, a, pid), s in sorted(by_problem.items())
        if s.files > 1
    ]
    kept = {
        v: {pid: why for pid, why in sorted(m.items()) if pid in categories}
        for v, m in (without_exchange or {}).items()
        if v in variants
    }
    return PublishedTable(
        attempts=k,
        variants=variants,
        rows=rows,
        repeated=repeated,
        without_exchange={v: m for v, m in kept.items() if m},
    )


def _count(n: float | None, of: int) -> str:
    if n is None:
        return ""
    count = f"{round(n, 2):g}"  # a mean over attempts may be a fraction of a problem
    return f"{count} ({100.0 * n / of:.1f}%)" if of else count


def to_markdown(table: PublishedTable) -> list[str]:
    """The table's Markdown lines: a variant column where more than one variant ran, best-of-k columns
    where there is more than one attempt."""
    k = table.attempts
    several = len(table.variants) > 1
    original = any(row.original_correct is not None for row in table.rows)
    head = ["variant"] if several else []
    head += ["category", "problems", "with a file", "not judged"]
    if k == 1:
        head += ["correct", "fast_1"] + ([BY_ORIGINAL] if original else [])
    else:
        head += ["correct (mean of k)", "fast_1 (mean of k)", f"correct, best of {k}", f"fast_1, best of {k}"]
        head += [f"{BY_ORIGINAL} (mean of k)", f"{BY_ORIGINAL}, best of {k}"] if original else []
    lines = [
        f"The published table: {k} attempt{'s' if k > 1 else ''}; every figure is of the suite's "
        "problems in the category, a problem with no file counting as not correct "
        '(docs/measurement.md, "The published table").'
        + (
            f" In the original variant, {BY_ORIGINAL} counts the files that pkb's protections fail "
            "while their outputs meet the original benchmark's rules (docs/variants.md)."
            if original
            else ""
        ),
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    for row in table.rows:
        cells = [row.variant] if several else []
        name = f"**{row.category}**" if row.category in (ALL, ALL_THAT_COMMUNICATE) else row.category
        cells += [name, str(row.problems), str(row.with_files), str(row.unjudged)]
        cells += [_count(row.correct, row.problems), _count(row.fast_1, row.problems)]
        if k > 1:
            cells += [_count(row.best_correct, row.problems), _count(row.best_fast_1, row.problems)]
        if original:
            cells.append(_count(row.original_correct, row.problems))
            cells += [_count(row.best_original_correct, row.problems)] if k > 1 else []
        lines.append("| " + " | ".join(cells) + " |")
    for variant, passable in table.without_exchange.items():
        lines += [
            "",
            f"Problems whose {variant} workload a solution that communicates nothing passes (counted in "
            f"**{ALL}**, left out of **{ALL_THAT_COMMUNICATE}**), each with its file's reason:",
            "",
        ]
        lines += [f"- {pid}: {why}" for pid, why in passable.items()]
    if table.repeated:
        lines += ["", "Problems with several files in one attempt (each counts once, by its best file):", ""]
        lines += [f"- {r}" for r in table.repeated]
    return lines
