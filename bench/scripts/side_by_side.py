"""The original benchmark's harness and pkb's `original` variant, side by side on the same files
(issue 28, item 7): does each give the same verdict, and where not, which of pkb's protections
explains the difference?

For every `{id}_{name}_{backend}.py` file given (or found in a folder given; the original's reference
files `{id}_{name}.py` too), one file at a time:

- original: the original benchmark's own launcher, unchanged, from a copy of it made in a temporary
  folder (`run_local.py --mode eval --problem ID --solution BACKEND --solutions-dir DIR --trials N
  --nproc-per-node W`), with pkb's stand-in for the worker its copy lacks
  (bench/scripts/original_worker.py) at scripts/worker.py. Its verdict is read from the
  `PKB_EVAL_JSON:` line it prints: pass when every trial's rank outputs match the reference's, fail
  when one does not or the solution's job fails; none ("n/a") when its own reference job fails,
  which on CPU names what the CPU backend cannot run. The file is copied into DIR under the name the
  original expects (its reference's stem and the backend); a backend its worker does not know (torch,
  cpp, ...) runs as `cuda`, whose set-up is the same NCCL process group as every other backend's.
  With `--device cpu` the ranks run over gloo (PKB_ORIGINAL_DEVICE=cpu, original_worker.py).
- pkb: `pkb check ID FILE --variant original` with the same world size and number of trials, its
  verdict, message and, where present, the protections its result names (`protections`).

Verdicts agree when both pass or both fail. The original passing a file that pkb fails is explained
when pkb's result names the protection(s) that failed it; every other difference is "unexplained".
The problem is the one pkb pairs the file with by its name (pkb_mcp/runs/pairing.py), for both sides.

The original side runs the candidate as the original does: in plain processes on this machine, no
sandbox. Give it only files you would run yourself.

On CPU (slow: two torchrun launches per trial on the original side):

    python3 bench/scripts/side_by_side.py ../shared/pkb-original/reference/1_allreduce.py \\
        --world-size 2 --device cpu --trials 1 --sandbox process

On GPUs, on the device machine from the repository root, with a copy of the original carried in
.gpu/pkb-original (`cp -r ../shared/pkb-original .gpu/`; .gpu is ignored and travels with carry):

    source .gpu/setup.sh && WS=2 bash bench/scripts/gpu_batch.sh side-by-side-a   # to -d; WS=4 where lent

or directly `python3 bench/scripts/side_by_side.py tests/candidates/original examples/original
--world-size 2 --device cuda --json out.jsonl`. Prints one row per file and a summary line; exits
1 when a disagreement is unexplained.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "original_worker.py"
ORIGINAL_PLACES = (REPO / ".gpu" / "pkb-original", REPO.parent / "shared" / "pkb-original")
EVAL_LINE = "PKB_EVAL_JSON:"
ORIGINAL_BACKENDS = ("triton", "cuda", "parallelkittens")  # its worker's, less `reference`
ERROR_LINE = re.compile(r"^\s*[\w.]*(Error|Exception|Interrupt)\b.*")


@dataclass
class Row:
    """One file's verdicts on both sides, and whether (and why) they differ."""

    file: str  # its name; `path` as given
    problem: int | None
    path: str = ""
    backend: str = ""  # the backend the original ran it as
    original: str = "n/a"  # pass, fail, or n/a (no verdict)
    original_why: str = ""
    pkb: str = "n/a"  # pass, fail, timeout, or n/a (refused)
    pkb_why: str = ""
    protections: list[str] = field(default_factory=list)
    agreement: str = "not compared"  # agree, disagree, not compared
    explanation: str = ""  # the protections named, "unexplained", or why not compared


# -- the original's output ----------------------------------------------------------------------


def last_error(text: str) -> str:
    """The last line of a log that names an error (a traceback's last line), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # torchrun's own report of a failed child comes last and names no cause
    errors = [line for line in lines if ERROR_LINE.match(line) and "ChildFailedError" not in line]
    return (errors or lines or [""])[-1][:300]


def original_verdict(stdout: str, stderr: str, returncode: int) -> tuple[str, str]:
    """The original harness's verdict on one file, from what run_local.py printed: (pass | fail |
    n/a, why). Its last `PKB_EVAL_JSON:` line carries the trials; without one it gave none."""
    payload = None
    for line in stdout.splitlines():
        if line.startswith(EVAL_LINE):
            try:
                payload = json.loads(line[len(EVAL_LINE) :])
            except json.JSONDecodeError:
                continue
    if not isinstance(payload, dict):
        return "n/a", f"run_local.py exited {returncode} with no verdict: {last_error(stderr or stdout)}"
    trials = [t for t in payload.get("trials") or [] if isinstance(t, dict)]
    if payload.get("all_ok") and trials:
        return "pass", f"{len(trials)} trial(s) match"
    if not trials:
        return "n/a", "no trial ran"
    last = trials[-1]
    result = str(last.get("result", ""))
    number = last.get("trial", len(trials) - 1)
    if result == "harness_environment":
        return "n/a", f"the harness's environment failed: {last.get('harness_hint', '')}"[:300]
    if result == "interrupted" or payload.get("interrupted"):
        return "n/a", "interrupted"
    if result == "no_artifacts":
        ref_job = last.get("reference_job") or {}
        if last.get("reference_returncode") != 0 or not last.get("reference_artifact_names"):
            why = last_error(str(ref_job.get("outputs_stderr") or ref_job.get("outputs_stdout") or ""))
            return "n/a", f"its reference did not run: {why}"
        sol_job = last.get("solution_job") or {}
        why = last_error(str(sol_job.get("outputs_stderr") or sol_job.get("outputs_stdout") or ""))
        code = last.get("solution_returncode")
        return "fail", f"trial {number}: the solution's job failed (exit {code}): {why}"
    compare = last.get("compare") or {}
    errors = compare.get("errors") or [result or "mismatch"]
    failed = [f["file"] for f in compare.get("per_file") or [] if isinstance(f, dict) and not f.get("ok")]
    where = f"{failed[-1]}: " if failed else ""  # the first rank file that differs
    return "fail", f"trial {number}: {where}{str(errors[0])[:300]}"


# -- the two sides ------------------------------------------------------------------------------


def prepare_original(source: Path, into: Path) -> Path:
    """A copy of the original benchmark with pkb's worker in place, and a `torchrun` on PATH that is
    this interpreter's (run_local.py calls `torchrun` by name)."""
    copy = into / "pkb-original"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("logs", "__pycache__"))
    (copy / "scripts").mkdir(exist_ok=True)
    shutil.copy(WORKER, copy / "scripts" / "worker.py")
    bin_dir = into / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    return copy


def reference_stem(copy: Path, problem: int) -> str | None:
    found = sorted(copy.glob(f"reference/{problem}_*.py"))
    return found[0].stem if found else None


def run_group(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    """A command in a session of its own, killed as a whole at its limit (the original's ranks are
    its grandchildren): (exit code, stdout, stderr), the exit code -9 where it was killed."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -9, out, err + f"\nTimeoutError: no verdict within {timeout:.0f} s"
    return proc.returncode, out, err


def run_original(copy: Path, work: Path, path: Path, problem: int, backend: str, args) -> Row:
    row = Row(file=path.name, problem=problem, backend=backend)
    stem = reference_stem(copy, problem)
    if stem is None:
        row.original_why = f"the original has no problem {problem}"
        return row
    solutions = Path(tempfile.mkdtemp(prefix="solutions_", dir=work))  # two folders may hold one name
    shutil.copy(path, solutions / f"{stem}_{backend}.py")
    cmd = [sys.executable, "run_local.py", "--mode", "eval", "--problem", str(problem)]
    cmd += ["--solution", backend, "--solutions-dir", str(solutions), "--trials", str(args.trials)]
    cmd += ["--nproc-per-node", str(args.world_size)]
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["PKB_ORIGINAL_DEVICE"] = args.device
    code, out, err = run_group(cmd, env, copy, args.timeout)
    row.original, row.original_why = original_verdict(out, err, code)
    return row


def run_pkb(row: Row, path: Path, args) -> None:
    cmd = [sys.executable, "-m", "pkb_mcp", "check", str(row.problem), str(path), "--variant", "original"]
    cmd += ["--world-size", str(args.world_size), "--trials", str(args.trials), "--json"]
    cmd += ["--device", args.device, "--sandbox", args.sandbox]
    code, out, err = run_group(cmd, dict(os.environ), REPO, args.timeout)
    try:
        result = json.loads(out)
    except json.JSONDecodeError:
        row.pkb, row.pkb_why = "n/a", f"pkb check exited {code} with no result: {last_error(err or out)}"
        return
    row.pkb, row.pkb_why = str(result.get("verdict")), str(result.get("message", ""))[:300]
    row.protections = [str(p) for p in result.get("protections") or []]


def judge(row: Row) -> None:
    """Agreement, and the explanation of a disagreement (module docstring)."""
    if row.original == "n/a" or row.pkb == "n/a":
        side = "original" if row.original == "n/a" else "pkb"
        row.agreement, row.explanation = "not compared", f"no {side} verdict"
    elif (row.original == "pass") == (row.pkb == "pass"):
        row.agreement, row.explanation = "agree", ""
    elif row.original == "pass" and row.protections:
        row.agreement, row.explanation = "disagree", "protection: " + ", ".join(row.protections)
    else:
        row.agreement, row.explanation = "disagree", "unexplained"


# -- files, table -------------------------------------------------------------------------------


def solution_files(items: list[Path]) -> list[Path]:
    files: list[Path] = []
    for item in items:
        found = sorted(item.glob("*.py")) if item.is_dir() else [item]
        files += [f for f in found if re.match(r"^\d{1,3}_\w+\.py$", f.name)]
    return files


def pairing_of(path: Path) -> tuple[int | None, str | None, str]:
    """pkb's problem for the file (by its name), its backend word, and why there is none."""
    from pkb_mcp.errors import UserError
    from pkb_mcp.runs import pairing

    try:
        paired = pairing.pair(path)
    except UserError as exc:
        return None, None, str(exc)
    if paired.problem is None:
        return None, None, "not named {id}_{name}_{backend}.py"
    return paired.problem.id, paired.backend, ""


def summary(rows: list[Row]) -> str:
    count = {k: sum(r.agreement == k for r in rows) for k in ("agree", "disagree", "not compared")}
    explained = sum(r.agreement == "disagree" and r.explanation != "unexplained" for r in rows)
    return (
        f"{len(rows)} files: {count['agree']} agree, {count['disagree']} disagree ({explained} "
        f"explained by a named protection, {count['disagree'] - explained} unexplained), "
        f"{count['not compared']} not compared"
    )


def print_row(row: Row) -> None:
    problem = "-" if row.problem is None else str(row.problem)
    cells = f"{row.file:<44} {row.original:<5} {row.pkb:<7} {row.agreement:<12}"
    print(f"{problem:>3}  {cells} {row.explanation}")
    for side, why in (("original", row.original_why), ("pkb", row.pkb_why)):
        if why and not (side == "original" and row.original == "pass"):
            print(f"{'':5}{side}: {why}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path, help="solution files, or folders of them")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if present")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--sandbox", default="auto", help="pkb's sandbox: auto, docker or process")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit of each side's run, seconds")
    parser.add_argument("--original", type=Path, default=None, help="the original benchmark's folder")
    parser.add_argument("--json", type=Path, default=None, help="also write one JSON line per file here")
    args = parser.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    source = args.original or next((p for p in ORIGINAL_PLACES if p.is_dir()), None)
    if source is None or not (source / "run_local.py").is_file():
        parser.error(f"no original benchmark at {source or ' or '.join(map(str, ORIGINAL_PLACES))}")

    if args.json is not None:
        args.json.write_text("")
    rows: list[Row] = []
    print(f"{'id':>3}  {'file':<44} {'orig':<5} {'pkb':<7} {'agreement':<12} explanation")
    with tempfile.TemporaryDirectory(prefix="pkb-side-") as tmp:
        work = Path(tmp)
        copy = prepare_original(source, work)
        for path in solution_files(args.paths):
            problem, word, why = pairing_of(path)
            if problem is None:
                row = Row(file=path.name, problem=None, explanation=why)
            else:
                backend = word if word in ORIGINAL_BACKENDS else "cuda"
                row = run_original(copy, work, path.resolve(), problem, backend, args)
                run_pkb(row, path.resolve(), args)
                judge(row)
            row.path = str(path)
            rows.append(row)
            print_row(row)
            if args.json is not None:  # written as it goes: a run stopped at its limit keeps what finished
                with args.json.open("a") as out:
                    out.write(json.dumps({**asdict(row), "world_size": args.world_size,
                                          "device": args.device, "trials": args.trials}) + "\n")  # fmt: skip
    print(summary(rows))
    return 1 if any(r.explanation == "unexplained" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
