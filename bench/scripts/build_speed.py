"""Issue 32's figures: what one iteration on a custom kernel costs, stage by stage.

    python3 bench/scripts/build_speed.py --out build.jsonl [--device cuda] [--world-size 2] [--files 10]

With an empty cache (a fresh PKB_CACHE_DIR) and through the service layer, as the MCP server and the
CLI call it (the Docker sandbox when an engine answers, else the process backend), in order:

  headers      torch's header precompiled for extension builds with default flags, in a build
               launch of its own (pkb_mcp/compile/headers.py), as `pkb serve` does when it starts:
               its wall (without this stage the first build compiles its C++ unit in full)
  first_build  check of an agent-style solution: discovery, the build launch, the check
  kernel_edit  check after an edit of the kernel's source alone (its cuda_sources; a C++-only
               solution has one unit, so on CPU the edit compiles everything again), once the
               headers' part the first build asked for is made (harness/prefixes.py; as an agent
               reads the first result before its edit): the wait for it, and what each build's
               units took and found (`units`)
  cached       check of the unchanged solution, --repeats times: each wall, their median
  plain        check of the problem's reference (no extension), --repeats times
  batch        `pkb eval` of --files copies of the solution, each with a kernel of its own
               (checked, and benchmarked on GPUs): files per minute, and each job's wait and run
               from the batch's job store, and the speedups; --no-warm without the batch's warm sandboxes
  discovery    what a kernel edit no longer pays before its build: a discovery launch of an edited
               text (pkb_mcp/compile/extensions.py `discover`), against reading its calls from the
               text (compile/literal_calls.py), --repeats times each, with example 001 on any device
               (not part of the default stages)
  versus_torch a fresh C++ extension (--device cpu's solution, its source edited each time) built by
               pkb's check, and its C++ source's syntax check by `pkb compile`, with a cold header
               cache (PKB_PRECOMPILED_HEADERS=0) and then a warm one (the default flags' header made
               first, as `headers`), against torch's own `load_inline` of the same source in a fresh
               build directory on the host before and after them; the build's seconds are those the
               check's note reports (the build launch, its sandbox's start and torch's import in it
               included). Its last row holds the ratios to torch's median (not part of the default
               stages)

The cached and plain stages are fresh service calls, each starting its sandboxes: a server's warm
check is faster (bench/scripts/turnaround.py measures that). With --server the service keeps warm
sandboxes as `pkb serve` does (for the build stages: a build launch then takes a warm tool sandbox,
torch imported ahead; a batch keeps its own otherwise).

The solution is examples/001_allreduce_cuda_oneshot.py on GPUs (bindings plus a CUDA kernel, built
with load_inline) and tests/candidates/cpp_extension_lazy.py on CPU (torch's CPU build cannot build
CUDA sources); --solution names another, e.g. tests/candidates/original_helper_cuda.py (one CUDA
source with its own bindings, as the original benchmark's published files are). An edit is a comment
line added at the top of the kernel's source string, which changes what the compiler reads and
nothing else. Each row is appended to --out as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SOLUTIONS = {
    # device: (file, the line that opens the kernel's source string)
    "cuda": (ROOT / "examples" / "001_allreduce_cuda_oneshot.py", 'CUDA_SOURCE = r"""'),
    "cpu": (ROOT / "tests" / "candidates" / "cpp_extension_lazy.py", 'CPP_SOURCE = """'),
}


def edited(text: str, opener: str, tag: str) -> str:
    """The solution with `// tag` as the first line of its kernel's source."""
    if opener not in text:
        raise SystemExit(f"the solution has no {opener!r} to edit")
    return text.replace(opener, f"{opener}// {tag}\n", 1)


def wait_for_headers() -> float:
    """Wait for the precompiled headers the builds asked for in the background; the seconds waited."""
    import threading

    t0 = time.monotonic()
    for thread in [t for t in threading.enumerate() if t.name == "headers"]:
        thread.join(600)
    return round(time.monotonic() - t0, 3)


def units() -> list[dict]:
    """Each built extension's units, oldest first: their seconds, and their headers' parts."""
    from harness.extensions import UNITS_MARK
    from pkb_mcp import config

    marks = sorted(config.extensions_dir().glob(f"*/{UNITS_MARK}"), key=lambda p: p.stat().st_mtime)
    found = [json.loads(p.read_text()) for p in marks]
    return [{k: m.get(k) for k in ("seconds", "chains", "precompiled", "parts")} for m in found]


def emit(out: Path, row: dict) -> None:
    row = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def check(path: Path, args: argparse.Namespace) -> dict:
    from pkb_mcp import service
    from pkb_mcp.models import RunRequest

    t0 = time.monotonic()
    r = service.check(
        RunRequest(problem=1, path=str(path), world_size=args.world_size, device=args.device, trials=1)
    )
    return {
        "wall_s": round(time.monotonic() - t0, 3),
        "verdict": r.verdict,
        "sandbox": r.sandbox.backend if r.sandbox else None,
        "notes": [n for n in r.notes if "extension" in n],
    }


TORCH_BUILD = """
import sys, time
from torch.utils.cpp_extension import load_inline
t0 = time.monotonic()
load_inline(name=sys.argv[1], cpp_sources=[sys.argv[2]], functions=["copy_of"], build_directory=sys.argv[3])
print(time.monotonic() - t0)
"""


def cpp_source(text: str) -> str:
    """The solution's C++ source string (CPP_SOURCE), read without running the file."""
    import ast

    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CPP_SOURCE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("the solution has no CPP_SOURCE string")


def torch_build(text: str, tag: str) -> float:
    """torch's own load_inline of the solution's C++ source, on the host, in a fresh build directory:
    the call's seconds (torch's import before it not counted)."""
    import subprocess

    build_dir = tempfile.mkdtemp(prefix="pkb-torch-build-")
    argv = [sys.executable, "-c", TORCH_BUILD, f"pkb_torch_{tag}", cpp_source(text), build_dir]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1200)
    return round(float(out.stdout.strip().splitlines()[-1]), 3)


def build_seconds(notes: list[str]) -> float | None:
    """The build's seconds from a check's note ("built extension NAME in 12.3 s ...")."""
    import re

    found = [m for n in notes if (m := re.search(r"built extension \S+ in ([0-9.]+) s", n))]
    return float(found[0].group(1)) if found else None


def compiled(path: Path) -> dict:
    """`pkb compile` of a solution (service.compile_file): its wall, and its C++ syntax check's seconds
    (the unit's build time: its slowest command run now) and whether it took torch's header."""
    from pkb_mcp import service
    from pkb_mcp.models import RunRequest

    t0 = time.monotonic()
    r = service.compile_file(RunRequest(path=str(path)))
    unit = r.units[0] if r.units else None
    return {
        "wall_s": round(time.monotonic() - t0, 3),
        "ok": r.ok,
        "check_s": unit.build_time_s if unit else None,
        "header": bool(unit and "(with torch's precompiled header)" in unit.log),
    }


def versus_torch(source: Path, opener: str, work: Path, args: argparse.Namespace, base: dict) -> None:
    """The versus_torch stage (module docstring)."""
    import threading

    from pkb_mcp.compile import headers
    from pkb_mcp.launches import ToolLaunches
    from sandbox import select_backend

    def fresh(tag: str) -> Path:
        path = work / f"001_allreduce_{tag}.py"
        path.write_text(edited(source.read_text(), opener, tag))
        return path

    torch_s = [torch_build(fresh("torch_before").read_text(), "before")]
    emit(args.out, {**base, "stage": "torch_load_inline", "n": 0, "wall_s": torch_s[0]})
    rows = {}
    for state in ("cold", "warm"):
        if state == "cold":
            os.environ["PKB_PRECOMPILED_HEADERS"] = "0"
        else:
            os.environ["PKB_PRECOMPILED_HEADERS"] = "1"
            t0 = time.monotonic()
            made = headers.prepare(headers.default_sets(), ToolLaunches(select_backend("auto")))
            emit(
                args.out,
                {**base, "stage": "headers", "wall_s": round(time.monotonic() - t0, 3), "made": made},
            )
        checked = check(fresh(f"check_{state}"), args)
        checked["build_s"] = build_seconds(checked["notes"])
        for thread in [t for t in threading.enumerate() if t.name == headers.THREAD]:
            thread.join(1200)  # none asked for when cold; made already when warm
        rows[state] = {"check": checked, "compile": compiled(fresh(f"compile_{state}"))}
        emit(args.out, {**base, "stage": f"{state}_header", **rows[state]})
    torch_s.append(torch_build(fresh("torch_after").read_text(), "after"))
    emit(args.out, {**base, "stage": "torch_load_inline", "n": 1, "wall_s": torch_s[1]})
    torch_median = statistics.median(torch_s)

    def ratio(value: float | None) -> float | None:
        return round(value / torch_median, 3) if value is not None else None

    summary = {
        "torch_load_inline_s": torch_s,
        **{f"{state}_build_ratio": ratio(rows[state]["check"]["build_s"]) for state in rows},
        **{f"{state}_check_wall_ratio": ratio(rows[state]["check"]["wall_s"]) for state in rows},
        **{f"{state}_syntax_check_s": rows[state]["compile"]["check_s"] for state in rows},
    }
    emit(
        args.out,
        {**base, "stage": "versus_torch", "cpus": os.cpu_count(), "load": os.getloadavg(), **summary},
    )


def timeline(store: Path, batch_start: float) -> dict:
    """Where a batch's time went, from its job store: each job's wait (from its submission: a check
    waits for its build, then for GPUs) and run, in seconds from the batch's start, and how long some
    job was running (at W = the node's GPUs, one at a time holds them all)."""
    import sqlite3

    with sqlite3.connect(store) as db:
        rows = db.execute(
            "SELECT kind, created, started, finished FROM jobs WHERE started IS NOT NULL ORDER BY started"
        ).fetchall()
    jobs = [
        {"kind": kind, "submitted_s": round(created - batch_start, 1),
         "started_s": round(begun - batch_start, 1), "run_s": round((ended or begun) - begun, 1)}
        for kind, created, begun, ended in rows
    ]  # fmt: skip
    busy, reach = 0.0, 0.0  # the union of the jobs' running spans
    for _, _, begun, ended in rows:
        begin, end = begun - batch_start, (ended or begun) - batch_start
        busy += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    by_kind = {
        k: round(sum(j["run_s"] for j in jobs if j["kind"] == k), 1) for k in {j["kind"] for j in jobs}
    }
    return {"jobs": jobs, "running_s": round(busy, 1), "run_s_by_kind": by_kind,
            "first_job_s": jobs[0]["started_s"] if jobs else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("build_speed.jsonl"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument(
        "--no-warm", action="store_true", help="the batch without warm sandboxes (pkb eval --no-warm)"
    )
    ap.add_argument("--solution", type=Path, help="another solution of problem 1 (with --opener)")
    ap.add_argument(
        "--opener", default='CUDA_SRC = r"""', help="the line that opens --solution's kernel source string"
    )
    ap.add_argument(
        "--stages", nargs="+", default=["headers", "first_build", "kernel_edit", "cached", "plain", "batch"]
    )
    ap.add_argument("--log", type=Path, help="write the service's info-level logs (JSON lines) here")
    ap.add_argument(
        "--server",
        action="store_true",
        help="keep warm sandboxes as `pkb serve` does, a build's warm tool sandbox among them",
    )
    args = ap.parse_args()
    if args.log:
        from pkb_mcp import log

        log.configure("info", open(args.log, "a"))  # noqa: SIM115 - open for the whole run
    os.environ["PKB_CACHE_DIR"] = tempfile.mkdtemp(prefix="pkb-build-speed-cache-")
    os.environ.setdefault("PKB_STATE_DIR", tempfile.mkdtemp(prefix="pkb-build-speed-state-"))
    source, opener = SOLUTIONS[args.device]
    if args.solution is not None:
        source, opener = args.solution.resolve(), args.opener
    work = Path(tempfile.mkdtemp(prefix="pkb-build-speed-"))
    solution = work / "001_allreduce_kernel.py"
    solution.write_text(edited(source.read_text(), opener, "iteration 0"))
    base = {"device": args.device, "world_size": args.world_size, "solution": str(source.relative_to(ROOT))}
    if args.server:
        from pkb_mcp.launches import enable_warm_pool
        from sandbox import select_backend

        enable_warm_pool(select_backend("auto"))
        base["server"] = True

    if "headers" in args.stages:
        from pkb_mcp.compile import headers
        from pkb_mcp.launches import ToolLaunches
        from sandbox import select_backend

        os.environ.setdefault("PKB_PRECOMPILED_HEADERS", "1")
        t0 = time.monotonic()
        made = headers.prepare(headers.default_sets(), ToolLaunches(select_backend("auto")))
        emit(args.out, {**base, "stage": "headers", "wall_s": round(time.monotonic() - t0, 3), "made": made})
    if "first_build" in args.stages:
        emit(args.out, {**base, "stage": "first_build", **check(solution, args)})
    if "kernel_edit" in args.stages:
        waited = wait_for_headers()
        solution.write_text(edited(source.read_text(), opener, "iteration 1"))
        row = {**base, "stage": "kernel_edit", **check(solution, args), "waited_for_parts_s": waited}
        emit(args.out, {**row, "units": units()})
    for stage, path in (("cached", solution), ("plain", ROOT / "problems" / "001_allreduce.py")):
        if stage in args.stages:
            runs = [check(path, args) for _ in range(args.repeats)]
            walls = [r["wall_s"] for r in runs]
            emit(
                args.out,
                {**base, "stage": stage, "walls_s": walls, "median_s": statistics.median(walls),
                 "verdicts": sorted({r["verdict"] for r in runs})},
            )  # fmt: skip
    if "discovery" in args.stages:
        from pkb_mcp.compile import extensions
        from pkb_mcp.compile.literal_calls import literal_calls
        from pkb_mcp.launches import ToolLaunches
        from sandbox import select_backend

        tools = ToolLaunches(select_backend("auto"))
        launches, reads = [], []
        example, example_opener = SOLUTIONS["cuda"]  # discovery imports it with stand-ins: no GPU needed
        for i in range(args.repeats):
            text = edited(example.read_text(), example_opener, f"discovery {i}")
            t0 = time.monotonic()
            found = extensions.discover(text, tools, 120.0)
            t1 = time.monotonic()
            literal = literal_calls(text)
            launches.append(round(t1 - t0, 3))
            reads.append(round(time.monotonic() - t1, 4))
            if not isinstance(found, dict) or literal is None:
                raise SystemExit(f"discovery gave {found!r:.200}; the text gave {literal!r:.200}")
        emit(
            args.out,
            {**base, "stage": "discovery", "solution": str(example.relative_to(ROOT)),
             "sandbox": tools.backend.name, "launch_s": launches,
             "read_s": reads, "median_launch_s": statistics.median(launches)},
        )  # fmt: skip
    if "versus_torch" in args.stages:
        versus_torch(source, opener, work, args, base)
    if "batch" in args.stages:
        from pkb_mcp.evaluation.batch import evaluate

        batch = work / "batch"
        batch.mkdir()
        for i in range(args.files):
            text = edited(source.read_text(), opener, f"file {i}")
            (batch / f"001_allreduce_kernel{i}.py").write_text(text)
        t0, started = time.monotonic(), time.time()
        report = evaluate(
            [batch],
            world_size=args.world_size,
            device=args.device,
            trials=1,
            bench=args.device == "cuda",
            store=work / "eval.sqlite",
            warm=not args.no_warm,
        )
        wall = time.monotonic() - t0
        emit(
            args.out,
            {**base, "stage": "batch", "files": args.files,
             "warm": args.device == "cuda" and not args.no_warm, "wall_s": round(wall, 3),
             "files_per_min": round(60 * args.files / wall, 2),
             "outcomes": sorted({r.outcome for r in report.results}),
             "speedups": sorted(round(r.speedup, 4) for r in report.results if r.speedup is not None),
             **timeline(work / "eval.sqlite", started)},
        )  # fmt: skip


if __name__ == "__main__":
    main()
