"""Check the original benchmark's own reference files against pkb's `original` variant (issue 28).

Each `{id}_{name}.py` under the original benchmark's reference folder is run unchanged as a candidate
of its problem in the `original` variant (`pkb check ID FILE --variant original`), one check at a time,
and its verdict is printed beside the reason where it is not a pass. Every such file should pass;
where the CPU backend cannot run one (CUDA or Triton in the file, a collective gloo lacks), the
reason names it. The files are read where they lie, never copied into this repository.

    python3 bench/scripts/original_references.py ../shared/pkb-original/reference --world-size 2 \\
        --device cpu --sandbox process [--only 21,22,23] [--json results.jsonl]

Problems without an `original` file yet are listed as such, not run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from pkb_mcp import problems

REFERENCE_NAME = re.compile(r"^(\d+)_(\w+)\.py$")


def run_one(pid: int, path: Path, args: argparse.Namespace) -> dict[str, object]:
    """One check in a child process (the CLI), its JSON result read back."""
    cmd = [sys.executable, "-m", "pkb_mcp", "check", str(pid), str(path), "--variant", "original"]
    cmd += ["--world-size", str(args.world_size), "--trials", "1", "--json", "--sandbox", args.sandbox]
    cmd += ["--device", args.device] if args.device else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"verdict": "refused", "message": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"verdict": result["verdict"], "message": result["message"]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reference_dir", type=Path)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", default=None)
    parser.add_argument("--sandbox", default="auto")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit of each check, seconds")
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON line per file here")
    parser.add_argument("--only", default="", help="comma-separated problem ids (default: every file)")
    args = parser.parse_args()

    built = problems.suite("original")
    rows = []
    for path in sorted(args.reference_dir.glob("*.py"), key=lambda p: int(p.name.split("_")[0])):
        match = REFERENCE_NAME.match(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if args.only and pid not in {int(i) for i in args.only.split(",")}:
            continue
        if pid not in built:
            row: dict[str, object] = {"verdict": "not built", "message": "no original file yet"}
        else:
            row = run_one(pid, path, args)
        row = {"problem": pid, "file": path.name, **row}
        rows.append(row)
        why = "" if row["verdict"] == "pass" else row["message"]
        print(f"{pid:>3}  {row['verdict']:<9}  {path.name}  {why}", flush=True)
    if args.json is not None:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    passed = sum(r["verdict"] == "pass" for r in rows)
    ran = sum(r["verdict"] != "not built" for r in rows)
    print(f"{passed} of {ran} run pass; {len(rows) - ran} not built yet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
