"""Where a CUDA unit's build time goes, and what running nvcc's two front-end chains at once saves.

    python3 bench/scripts/nvcc_phases.py --out nvcc.jsonl [--file examples/001_allreduce_cuda_oneshot.py]
        [--variable CUDA_SOURCE] [--repeats 2]

The unit is the `cuda.cu` that `load_inline` writes for the file's first call with CUDA sources, as
read from the file's text (pkb_mcp/compile/literal_calls.py: its sources and `no_implicit_headers`;
never imported), else for the string --variable names, compiled with the exact command torch's
build file gives it (its flags, include paths and architectures: this machine's torch and
TORCH_CUDA_ARCH_LIST), in a scratch folder.
Each repeat runs, side by side in time order, alternating which goes first:

  nvcc   the command as torch runs it, with `-time` (each phase's milliseconds, one row each)
  split  the same command through harness/nvcc.py (host and device front ends at once)

Rows (JSON lines, appended to --out as measured): {"mode", "repeat", "wall_s"} and, for nvcc,
{"phases": {name: ms}}. Needs nvcc and torch's CUDA headers (a CUDA build of torch).

With --at-once K[,K...] it measures instead what a wave of builds does to each of them, as a batch's
build pool starts them: K copies of the unit, each in a folder of its own, compiled through
harness/nvcc.py at once (K processes started together), each one's wall from the common start
(rows {"mode": "at_once", "count", "index", "nice", "wall_s"}); with --nice N every copy but the
first runs at that niceness, so the rows tell whether the first build of a wave can be given the
CPU the others share (a priority) or whether they slow it where the cores are not all taken.

It compiles outside any sandbox: a measurement of the project's own examples, never a tool for
candidate files (pkb compiles those only in build launches).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import extensions, nvcc, objects  # noqa: E402
from pkb_mcp.compile import extensions as builds  # noqa: E402
from pkb_mcp.compile.literal_calls import literal_calls  # noqa: E402


def cuda_source(path: Path, variable: str) -> str:
    """The string assigned to `variable` at the top of the file, read from its syntax tree."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if variable in names and isinstance(node.value.value, str):
                return node.value.value
    raise SystemExit(f"{path} assigns no string to {variable}")


def cuda_request(path: Path, variable: str) -> extensions.Request:
    """The file's first load_inline request with CUDA sources, read from its text, else one of the string
    assigned to `variable` with load_inline's defaults."""
    calls = literal_calls(path.read_text())
    found = [r for r in builds.parse_requests(calls)[0] if r.cuda_sources] if calls else []
    if found:
        return found[0]
    return extensions.Request(name="phases", cpp_sources=("",), cuda_sources=(cuda_source(path, variable),))


def cuda_step(request: extensions.Request, directory: Path) -> objects.Step:
    steps = extensions.build_steps(request, extensions.source_files(request, directory), directory)
    if steps is None:
        raise SystemExit("this torch's build file is not one harness/objects.py runs")
    return next(s for s in steps if s.rule == "cuda_compile")


def phases(table: Path) -> dict[str, float]:
    with table.open() as f:
        rows = list(csv.reader(f))
    return {f"{r[1].strip()} {r[4].strip()}".strip(): float(r[6]) for r in rows[1:] if len(r) > 6}


def measure(mode: str, step: objects.Step, directory: Path) -> dict:
    (directory / step.output).unlink(missing_ok=True)
    start = time.perf_counter()
    if mode == "nvcc":
        table = directory / "phases.csv"
        table.unlink(missing_ok=True)
        command = f"{step.command} -time {table}"
        proc = subprocess.run(["/bin/sh", "-c", command], cwd=directory, capture_output=True, check=False)
        if proc.returncode != 0:
            raise SystemExit((proc.stdout + proc.stderr).decode(errors="replace")[-4000:])
        row: dict = {"wall_s": round(time.perf_counter() - start, 3), "phases": phases(table)}
    else:
        if not nvcc.compile_unit(step.command, directory, Path(step.inputs[0]), step.output):
            raise SystemExit("harness/nvcc.py does not split this command's plan")
        row = {"wall_s": round(time.perf_counter() - start, 3)}
    if not (directory / step.output).is_file():
        raise SystemExit(f"{mode} left no {step.output}")
    return row


def at_once(request: extensions.Request, count: int, niceness: int, scratch: Path) -> list[dict]:
    """`count` copies of the unit compiled through harness/nvcc.py at once, all but the first at
    `niceness`: each copy's wall from the common start."""
    jobs = []
    for index in range(count):
        directory = scratch / f"copy{count}-{niceness}-{index}"
        directory.mkdir()
        step = cuda_step(request, directory)
        spec = json.dumps([step.command, str(directory), step.inputs[0], step.output])
        jobs.append(
            (directory / step.output, [sys.executable, __file__, "--one", spec], niceness if index else 0)
        )
    start = time.perf_counter()
    procs = [
        subprocess.Popen(argv, preexec_fn=(lambda n=nice: os.nice(n)) if nice else None)
        for _, argv, nice in jobs
    ]
    walls: dict[int, float] = {}
    while len(walls) < len(procs):
        for index, proc in enumerate(procs):
            if index not in walls and proc.poll() is not None:
                walls[index] = round(time.perf_counter() - start, 3)
                if proc.returncode != 0 or not jobs[index][0].is_file():
                    raise SystemExit(f"copy {index} of {count} failed (exit {proc.returncode})")
        time.sleep(0.05)
    return [
        {"mode": "at_once", "count": count, "index": i, "nice": jobs[i][2], "wall_s": walls[i]}
        for i in range(count)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--file", type=Path, default=ROOT / "examples" / "001_allreduce_cuda_oneshot.py")
    ap.add_argument("--variable", default="CUDA_SOURCE")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--at-once", default="", help="comma-separated counts of copies compiled at once")
    ap.add_argument("--nice", type=int, default=0, help="the niceness of every copy but the first")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pkb-nvcc-") as scratch:
        directory = Path(scratch)
        request = cuda_request(args.file, args.variable)
        if args.at_once:
            for count in (int(c) for c in args.at_once.split(",")):
                for row in at_once(request, count, args.nice, directory):
                    emit(args.out, {**row, "file": args.file.name})
            return
        step = cuda_step(request, directory)
        for repeat in range(args.repeats):
            order = ("nvcc", "split") if repeat % 2 == 0 else ("split", "nvcc")
            for mode in order:
                row = {"mode": mode, "repeat": repeat, "file": args.file.name}
                emit(args.out, {**row, **measure(mode, step, directory)})


def emit(out: Path, row: dict) -> None:
    """A measured row, dated, appended to `out` and printed."""
    row = {**row, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":  # one copy of --at-once, in a process of its own
        command, folder, source, output = json.loads(sys.argv[2])
        sys.exit(0 if nvcc.compile_unit(command, Path(folder), Path(source), output) else 1)
    main()
