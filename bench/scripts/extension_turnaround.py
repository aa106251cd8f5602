"""Issue 16's figures: a solution that builds its CUDA with load_inline, through the MCP server as an
agent uses it. Run on a GPU node from the repository root (Docker sandbox when an engine answers):

    python3 bench/scripts/extension_turnaround.py --out ext.jsonl [--world-size 2] [--repeats 8]

With an empty extension cache (a fresh PKB_CACHE_DIR), in order:
  first_check   run_correctness (5 trials): discovery, the build job, then the check: the first-build cost
  compile       compile_kernel of the same file: diagnostics, and the build found in the cache
  warm_check    run_correctness again, `--repeats` times, `--think-s` apart (an agent editing): median wall
  bench         benchmark against the reference at `pkb` and `large`: speedup and % of floor
Each row is appended to the JSONL file as soon as it is measured. `--device cpu` is a dry run on a
machine without GPUs, with the C++ candidate of the tests. `--world-size 1` (a node of one GPU) runs
problem 1 with its world-size rule opened to one rank, an all-reduce that is a copy: the build and the
turnaround are measured, the benchmark is not meaningful there and is skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
from turnaround import call, emit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("ext.jsonl"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--think-s", type=float, default=3.0)
    ap.add_argument(
        "--solution",
        type=Path,
        help="default: examples/001_allreduce_cuda_oneshot.py (cpu: the test C++ one)",
    )
    ap.add_argument("--sizes", nargs="*", default=["pkb", "large"])
    args = ap.parse_args()
    cuda = args.device == "cuda"
    default = ROOT / (
        "examples/001_allreduce_cuda_oneshot.py" if cuda else "tests/candidates/cpp_extension_lazy.py"
    )
    solution = (args.solution or default).resolve()
    os.environ["PKB_CACHE_DIR"] = tempfile.mkdtemp(prefix="pkb-ext-cache-")  # an empty extension cache
    if args.world_size == 1:
        single = Path(tempfile.mkdtemp(prefix="pkb-problems-"))
        text = (ROOT / "problems" / "001_allreduce.py").read_text()
        rule = 'return None if world_size >= 2 else "needs at least 2 ranks"'
        (single / "001_allreduce.py").write_text(text.replace(rule, "return None"))
        os.environ["PKB_PROBLEMS_DIR"] = str(single)
        args.sizes = []

    import torch
    from mcp import Client

    from pkb_mcp.frontends.server import build_server
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore
    from pkb_mcp.launches import enable_warm_pool, warm_key
    from sandbox import select_backend

    backend = select_backend("auto")
    ws = args.world_size
    gpus = torch.cuda.device_count() if cuda else 0
    emit(
        args.out,
        {
            "part": "machine",
            "backend": backend.name,
            "torch": torch.__version__,
            "gpus": gpus,
            "solution": str(solution.relative_to(ROOT)),
        },
    )
    state = Path(tempfile.mkdtemp(prefix="pkb-ext-state-"))
    scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus)
    pool = enable_warm_pool(backend)
    if pool is not None:
        pool.replenish(warm_key(args.device, list(range(ws)) if cuda else [], ws, 1))
    server = build_server(scheduler, state / "sources")
    check = {"problem": 1, "path": str(solution), "world_size": ws, "device": args.device, "trials": 5}

    async def session() -> None:
        async with Client(server) as client:
            res, wall = await call(client, "run_correctness", check)
            emit(
                args.out,
                {
                    "part": "first_check",
                    "wall_s": round(wall, 2),
                    "verdict": res.get("verdict"),
                    "notes": res.get("notes"),
                    "message": res.get("message"),
                },
            )
            res, wall = await call(client, "compile_kernel", {"path": str(solution)})
            emit(
                args.out,
                {
                    "part": "compile",
                    "wall_s": round(wall, 2),
                    "ok": res.get("ok"),
                    "notes": res.get("notes"),
                    "units": res.get("units"),
                },
            )
            walls = []
            for n in range(args.repeats):
                await anyio.sleep(args.think_s)
                res, wall = await call(client, "run_correctness", check)
                walls.append(wall)
                emit(
                    args.out,
                    {
                        "part": "warm_check",
                        "n": n,
                        "wall_s": round(wall, 3),
                        "verdict": res.get("verdict"),
                        "notes": res.get("notes"),
                    },
                )
            emit(
                args.out,
                {
                    "part": "warm_check_summary",
                    "median_s": round(statistics.median(walls), 3),
                    "min_s": round(min(walls), 3),
                    "max_s": round(max(walls), 3),
                    "n": len(walls),
                },
            )
            for size in args.sizes:
                bench = {k: v for k, v in check.items() if k != "trials"} | {"size": size}
                res, wall = await call(client, "benchmark", bench)
                roof = res.get("roofline") or {}
                emit(
                    args.out,
                    {
                        "part": "bench",
                        "size": size,
                        "wall_s": round(wall, 1),
                        "verdict": res.get("verdict"),
                        "speedup": res.get("speedup"),
                        "speedup_low": res.get("speedup_low"),
                        "speedup_high": res.get("speedup_high"),
                        "reference_ms": (res.get("reference") or {}).get("median_ms"),
                        "candidate_ms": (res.get("candidate") or {}).get("median_ms"),
                        "pct_of_floor": roof.get("pct_of_floor"),
                        "floor_ms": roof.get("floor_ms"),
                        "message": res.get("message"),
                    },
                )

    anyio.run(session)
    if pool is not None:
        pool.close()


if __name__ == "__main__":
    main()
