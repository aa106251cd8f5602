"""Every benchmark row of gpu_report.py's JSONL files as one compact CSV (bench/gpu-runs/benchmarks.csv).

The results page cites benchmark figures by this CSV, so that the raw JSONL files (a few hundred KB)
need not stay in the repository: each row names the file it came from (`call`, relative to the
folder given by --root), which git history keeps. One row per `refs` (a reference against itself)
or `examples` (an example against the reference) row; `machine` rows give the date.

    python3 bench/scripts/bench_csv.py --root bench/gpu-runs bench/gpu-runs/*/*.jsonl > benchmarks.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

FIELDS = [
    "date",
    "call",
    "part",
    "problem",
    "solution",
    "world_size",
    "size",
    "launches",
    "verdict",
    "speedup",
    "speedup_low",
    "speedup_high",
    "ref_ms",
    "cand_ms",
    "pct_of_floor",
    "bound",
    "ref_iqr_pct",
    "ref_replay_advantage",
    "warnings",
]


def _num(x: object, digits: int = 4) -> str:
    return "" if x is None else f"{float(x):.{digits}g}"  # type: ignore[arg-type]


def rows(path: Path, call: str) -> list[dict[str, str]]:
    """The benchmark rows of one JSONL file, in the CSV's fields."""
    out = []
    date = ""
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("part") == "machine":
            date = str(r.get("date", ""))[:10]
            continue
        if r.get("part") not in ("refs", "examples") or "speedup" not in r:
            continue
        ref, cand = r.get("reference") or {}, r.get("candidate") or {}
        median = ref.get("median_ms")
        iqr = ref.get("iqr_ms")
        out.append(
            {
                "date": date,
                "call": call,
                "part": r["part"],
                "problem": str(r.get("problem", "")),
                "solution": Path(str(r["solution"])).name if r["part"] == "examples" else "",
                "world_size": str(r.get("world_size", "")),
                "size": str(r.get("size", "")),
                "launches": str(ref.get("launches") or ref.get("jobs") or ""),
                "verdict": str(r.get("verdict", "")),
                "speedup": _num(r.get("speedup")),
                "speedup_low": _num(r.get("speedup_low")),
                "speedup_high": _num(r.get("speedup_high")),
                "ref_ms": _num(median),
                "cand_ms": _num(cand.get("median_ms")),
                "pct_of_floor": _num(r.get("pct_of_floor"), 3),
                "bound": str(r.get("bound") or ""),
                "ref_iqr_pct": _num(100 * iqr / median, 3) if iqr is not None and median else "",
                "ref_replay_advantage": _num(ref.get("replay_advantage")),
                "warnings": str(len(r.get("warnings") or [])),
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--root", type=Path, default=Path("."), help="`call`: the path relative to this")
    args = ap.parse_args(argv)
    writer = csv.DictWriter(sys.stdout, FIELDS, lineterminator="\n")
    writer.writeheader()
    for path in args.files:
        call = str(path.resolve().relative_to(args.root.resolve()))
        writer.writerows(rows(path, call))


if __name__ == "__main__":
    main()
