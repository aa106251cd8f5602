"""The scores of a `pkb eval` batch and its report formats: JSON, CSV, a Markdown table and a PNG.

Every score is defined once, in docs/measurement.md ("Batch evaluation"); `summarize` computes them
over the files, and pkb_mcp/evaluation/table.py the published table over the suite's problems.
The PNG needs matplotlib, an optional extra (`pip install pkb-mcp[plots]`): without it the other
formats are written and a note says what is missing.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from pkb_mcp import render
from pkb_mcp.evaluation import table
from pkb_mcp.evaluation.records import NOT_ATTEMPTED, EvalReport, EvalSummary, FileResult, is_fast

FAST_P = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
CSV_COLUMNS = [
    "file",
    "problem_id",
    "problem",
    "backend",
    "convention",
    "outcome",
    "correct",
    "original_correct",
    "protections",
    "generalizes",
    "speedup",
    "speedup_low",
    "speedup_high",
    "credited",
    "candidate_ms",
    "reference_ms",
    "floor_ms",
    "pct_of_floor",
    "reused",
    "pairing",
    "message",
    "attempt",
]
NO_MATPLOTLIB = "PNG not written: matplotlib is not installed (pip install 'pkb-mcp[plots]')"


def attempted(results: list[FileResult]) -> list[FileResult]:
    """Files run to a verdict: neither skipped nor stopped by an error of the harness or environment."""
    return [r for r in results if r.outcome not in NOT_ATTEMPTED]


def fast_p(results: list[FileResult], p: float) -> float | None:
    """The fraction of attempted files that are correct with a credited speedup above p (at p = 0,
    every correct file); None when no file was attempted."""
    tried = attempted(results)
    if not tried:
        return None
    if p == 0:
        return sum(r.correct for r in tried) / len(tried)
    fast = [r for r in tried if is_fast(r, p)]
    return len(fast) / len(tried)


def summarize(results: list[FileResult]) -> EvalSummary:
    tried = attempted(results)
    correct = sum(r.correct for r in tried)
    benched = any(r.speedup is not None for r in tried)
    speeds = [r.speedup for r in tried if r.correct and r.credited and r.speedup]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return EvalSummary(
        files=len(results),
        attempted=len(tried),
        correct=correct,
        correct_pct=100.0 * correct / len(tried) if tried else None,
        generalizes=sum(r.correct and r.generalizes == "yes" for r in tried),
        generalization_judged=sum(r.correct and r.generalizes is not None for r in tried),
        fast_p={f"{p:g}": fast_p(results, p) for p in FAST_P if p == 0 or benched},
        geomean_speedup=math.exp(sum(math.log(s) for s in speeds) / len(speeds)) if speeds else None,
        outcomes=outcomes,
    )


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "" if value is None else format(value, fmt)


def to_csv(report: EvalReport) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in report.results:
        writer.writerow({**r.model_dump(mode="json"), "protections": " ".join(r.protections)})
    return out.getvalue()


def speed_text(r: FileResult) -> str:
    if r.speedup is None:
        return ""
    spread = f" ({r.speedup_low:.2f}-{r.speedup_high:.2f})" if r.speedup_low is not None else ""
    return f"{r.speedup:.3f}x{spread}" + ("" if r.credited else " not credited")


def to_markdown(report: EvalReport) -> str:
    s, st = report.summary, report.settings
    several = report.table is not None and report.table.attempts > 1
    lines = [
        "# pkb eval",
        "",
        f"{render.counted(s.files, 'file')}; world size {st.world_size}, device {st.device}, size {st.size}, "
        f"{render.counted(st.trials, 'trial')}, sandbox {st.sandbox}, convention {st.convention}; "
        f"{report.wall_s:.1f} s" + (f"; {report.resumed} from an earlier run" if report.resumed else ""),
        "",
        ("| attempt " if several else "")
        + "| file | problem | convention | outcome | speedup (quartile range) | % of floor | message |",
        ("| --- " if several else "") + "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    passable = report.table.without_exchange if report.table is not None else {}
    for r in report.results:
        problem = f"{r.problem_id} {r.problem or ''}".strip() if r.problem_id is not None else ""
        if r.problem_id in passable.get(table.variant_of(r), {}):
            problem += " (passes without communicating)"
        message = r.message.replace("|", "\\|").replace("\n", " ")
        message = message if len(message) <= 160 else message[:157] + "..."
        lines.append(
            (f"| {r.attempt + 1} " if several else "")
            + f"| {Path(r.file).name} | {problem} | {r.convention or ''} | {r.outcome} | {speed_text(r)} | "
            f"{_num(r.pct_of_floor, '.1f')} | {message} |"
        )
    remarks = [r.pairing for r in report.results if r.pairing]
    if remarks:
        lines += ["", "Files paired with a problem other than their id's, or by their id alone:", ""]
        lines += [f"- {remark}" for remark in remarks]
    lines += ["", "| score | value |", "| --- | --- |"]
    lines.append(f"| attempted | {s.attempted} of {s.files} |")
    lines.append(f"| correct | {s.correct} ({_num(s.correct_pct, '.1f')}%) |")
    if s.generalization_judged:
        lines.append(
            f"| correct and generalizes (of those judged) | {s.generalizes} of {s.generalization_judged} |"
        )
    for p, value in s.fast_p.items():
        lines.append(f"| fast_{p} | {_num(value, '.3f')} |")
    lines.append(f"| geometric mean speedup (correct) | {_num(s.geomean_speedup)} |")
    lines.append(f"| outcomes | {', '.join(f'{k} {v}' for k, v in sorted(s.outcomes.items()))} |")
    if report.table is not None:
        lines += ["", *table.to_markdown(report.table)]
    lines += ["", 'Definitions: docs/measurement.md, "Batch evaluation" and "The published table".']
    return "\n".join(lines) + "\n"


def write_png(report: EvalReport, path: Path) -> str | None:
    """Speedup per file against the floor's speedup, and the fast_p curve; None, or why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    scored = [r for r in report.results if r.correct and r.speedup is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [Path(r.file).stem for r in scored]
    xs = list(range(len(scored)))
    if scored:
        speeds = [r.speedup or 0.0 for r in scored]
        low = [max(0.0, (r.speedup or 0.0) - (r.speedup_low or r.speedup or 0.0)) for r in scored]
        high = [max(0.0, (r.speedup_high or r.speedup or 0.0) - (r.speedup or 0.0)) for r in scored]
        colors = ["tab:blue" if r.credited else "tab:gray" for r in scored]
        left.bar(xs, speeds, yerr=[low, high], color=colors, capsize=3, label="speedup (quartile range)")
        floors = [(x, r.floor_speedup) for x, r in zip(xs, scored, strict=True) if r.floor_speedup]
        if floors:
            left.scatter(
                [x for x, _ in floors], [f for _, f in floors], marker="_", s=400, color="tab:red",
                label="speedup at the floor",
            )  # fmt: skip
        left.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("speedup over the reference")
    floor_note = "" if any(r.floor_speedup for r in scored) else " (no floor on CPU)"
    left.set_title(f"correct files{floor_note}")
    if scored:
        left.legend(fontsize=8)
    top = max([2.0, *[(r.speedup or 0.0) * 1.1 for r in scored]])
    ps = [top * i / 200 for i in range(201)]
    curve = [fast_p(report.results, p) or 0.0 for p in ps]
    right.step(ps, curve, where="post")
    right.set_xlabel("p (speedup threshold)")
    right.set_ylabel("fast_p")
    right.set_ylim(0, 1.05)
    right.set_title(f"fast_p over {report.summary.attempted} attempted files")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_reports(report: EvalReport, out_dir: Path) -> tuple[dict[str, str], list[str]]:
    """report.json, report.csv, report.md and report.png in `out_dir`: {format: path}, and notes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {
        "json": out_dir / "report.json",
        "csv": out_dir / "report.csv",
        "md": out_dir / "report.md",
        "png": out_dir / "report.png",
    }
    written["csv"].write_text(to_csv(report))
    written["md"].write_text(to_markdown(report))
    notes = []
    why_not = write_png(report, written["png"])
    if why_not:
        notes.append(why_not)
        del written["png"]
    paths = {k: str(v) for k, v in written.items()}
    final = report.model_copy(update={"reports": paths, "notes": [*report.notes, *notes]})
    written["json"].write_text(final.model_dump_json(indent=2))
    return paths, notes
