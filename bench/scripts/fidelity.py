"""Issue 5's fidelity figures from the self-benchmark calls that gpu_report.py recorded.

Each JSONL file is one call: every reference benchmarked against itself (`refs` rows). Prints a
markdown table, one row per problem (reference median per call, speedup per call in bold when
outside 1.00 +- the tolerance, the spread of placements inside a job, the spread between the jobs,
% of floor in the last call), then per call: which problems landed outside, and without the
problems named by --exclude the standard deviation of log(speedup) and the largest deviation.

Spreads are standard deviations of log(time), in percent. "In a job": of a side's placement
medians, averaged over every side of every call. "Between jobs": of the sides' medians over all calls
(reference and candidate: two jobs per call; with several jobs per side, each side's median is
already the median of its jobs'). If placements were as independent as jobs, the second
would be about the first over the square root of the number of placements.

    python3 bench/scripts/fidelity.py placed{1,2,3}_p4.jsonl --exclude 10

(the raw files of the 2026-11-22 runs are in git history: `git show 52f55d6:docs/gpu-runs/PATH`).

A call that `gpu_batch.sh jobs-a` and `jobs-b` recorded in two halves is given as
`jobs4_1_a.jsonl,jobs4_1_b.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pkb_mcp import problems  # noqa: E402
from pkb_mcp.runs import stats  # noqa: E402

SIDES = ("reference", "candidate")


def load(call: str) -> dict[int, dict]:
    """One call's rows by problem; a call recorded in parts is its files joined with commas."""
    rows = [
        json.loads(line) for p in call.split(",") for line in Path(p).read_text().splitlines() if line.strip()
    ]
    return {int(r["problem"]): r for r in rows if r.get("part") == "refs" and r.get("speedup")}


def log_sd_pct(values: list[float]) -> float:
    return (stats.log_spread(values) or 0.0) * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calls", nargs="+", help="one gpu_report.py JSONL file per call (parts: A.jsonl,B.jsonl)")
    ap.add_argument("--tolerance", type=float, default=0.03, help="allowed deviation from 1.00x")
    ap.add_argument("--exclude", default="", help="problems left out of the per-call figures")
    args = ap.parse_args()
    calls = [load(p) for p in args.calls]
    excluded = {int(x) for x in args.exclude.split(",") if x}
    common = sorted(set.intersection(*(set(c) for c in calls)))

    def outside(x: float) -> bool:
        return abs(x - 1) > args.tolerance

    def shown(x: float) -> str:
        return f"**{x:.3f}**" if outside(x) else f"{x:.3f}"

    print(
        "| problem | reference ms (each call) | speedup (each call) | spread of placements in a job "
        "| spread between jobs | % of floor (last call) |"
    )
    print("|---|---|---|---|---|---|")
    for pid in common:
        rows = [c[pid] for c in calls]
        spreads = [r[s].get("placement_spread") for r in rows for s in SIDES]
        within = f"{statistics.fmean(spreads) * 100:.2f}%" if all(x is not None for x in spreads) else "-"
        between = log_sd_pct([r[s]["median_ms"] for r in rows for s in SIDES])
        floor = rows[-1].get("pct_of_floor")
        ref_ms = " / ".join(f"{r['reference']['median_ms']:.4g}" for r in rows)
        print(
            f"| {pid} {problems.resolve(pid).name} | {ref_ms} "
            f"| {' / '.join(shown(r['speedup']) for r in rows)} | {within} | {between:.2f}% "
            f"| {'-' if floor is None else f'{floor:.1f}'} |"
        )
    print()
    for files, call in zip(args.calls, calls, strict=True):
        name = "+".join(Path(p).name for p in files.split(","))
        kept = {pid: r for pid, r in call.items() if pid not in excluded}
        logs = [math.log(r["speedup"]) for r in kept.values()]
        out = sorted(pid for pid, r in call.items() if outside(r["speedup"]))
        print(
            f"{name}: {len(call)} problems, outside 1.00 +- {args.tolerance:.0%}: "
            f"{', '.join(map(str, out)) or 'none'}; without {sorted(excluded) or 'none'}: "
            f"sd of log(speedup) {statistics.pstdev(logs) * 100:.2f}%, "
            f"largest deviation {max(abs(r['speedup'] - 1) for r in kept.values()) * 100:.1f}%"
        )


if __name__ == "__main__":
    main()
