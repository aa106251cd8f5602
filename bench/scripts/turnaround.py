"""Issue 5's figures: turnaround of a warm server, fidelity of repeated benchmarks, scheduling
throughput, and the node's calibration. Run on a GPU node from the repository root:

    python3 bench/scripts/turnaround.py --out turnaround.jsonl [--budget-s 480]

Everything goes through the real MCP server (the SDK's in-process client against `build_server`, the
scheduler, the Docker sandbox when an engine answers, sandboxes started ahead of need) as an agent
would use it. Parts, in order (each row is appended to the JSONL file as soon as it is measured):
  calibrate   `pkb calibrate` on all GPUs (saved: the roofline uses it from then on)
  check       run_correctness of problem 1, 5 trials, 4 GPUs (--world-size), repeated, of each of
              --check-files (default: its reference); the first call of each is reported apart
  bench12     benchmark of examples/012 on problem 12, three calls (end-to-end wall, speedup spread);
              `--launches L` times each side in L launches. On CPU: problem 1's reference against itself
  throughput  8 clients submit 40 run_correctness jobs (world size 2) at once: none lost, per-client
              completion times, checks per minute
  fidelity    every reference benchmarked against itself in three separate calls, while budget lasts
`--device cpu` is a dry run on a machine without GPUs (smaller counts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from pkb_mcp import problems, service  # noqa: E402


def emit(out: Path, row: dict) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("result",)})[:400], flush=True)


async def call(client: Any, tool: str, args: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = await client.call_tool(tool, args)
    res = (r.structured_content or {}).get("result") or {"verdict": "error", "message": str(r.content)[:300]}
    return res, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("turnaround.jsonl"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--parts", nargs="+", default=["calibrate", "check", "bench12", "throughput", "fidelity"])
    ap.add_argument("--check-repeats", type=int, default=7)
    ap.add_argument(
        "--check-files",
        type=Path,
        nargs="+",
        default=[ROOT / "problems" / "001_allreduce.py"],
        help="solutions of problem 1 that the check part checks in turn, --check-repeats times each "
        "(default: its reference); a file's first check is reported apart (it may build its extensions)",
    )
    ap.add_argument("--think-s", type=float, default=10.0, help="pause between checks (an agent thinking)")
    ap.add_argument(
        "--budget-s", type=float, default=480.0, help="stop starting new fidelity calls after this"
    )
    ap.add_argument("--world-size", type=int, help="ranks of the checks and benchmarks (cuda: 4, cpu: 2)")
    ap.add_argument("--log", type=Path, help="write the server's info-level logs (JSON lines) here")
    ap.add_argument(
        "--launches", type=int, default=1, help="launches per side of every benchmark (bench12, fidelity)"
    )
    args = ap.parse_args()
    if args.log:
        from pkb_mcp import log

        log.configure("info", open(args.log, "a"))  # noqa: SIM115 - open for the whole run
    t_start = time.monotonic()
    cuda = args.device == "cuda"
    ws = args.world_size or (4 if cuda else 2)

    import torch
    from mcp import Client

    from pkb_mcp.frontends.server import build_server
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore
    from pkb_mcp.launches import enable_warm_pool, warm_key
    from sandbox import select_backend

    backend = select_backend("auto")
    emit(
        args.out,
        {
            "part": "machine",
            "backend": backend.name,
            "torch": torch.__version__,
            "gpus": torch.cuda.device_count() if cuda else 0,
        },
    )

    if "calibrate" in args.parts:
        t0 = time.perf_counter()
        c = service.calibrate(ws if cuda else 2, args.device)
        emit(
            args.out,
            {
                "part": "calibrate",
                "wall_s": round(time.perf_counter() - t0, 1),
                "ceilings": c.ceilings.model_dump(),
                "details": c.details,
                "saved_to": c.saved_to,
            },
        )

    gpus = torch.cuda.device_count() if cuda else 0
    state = args.out.parent / "turnaround-state"
    scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus)
    pool = enable_warm_pool(backend)
    if pool is not None:
        pool.replenish(warm_key(args.device, list(range(ws)) if cuda else [], ws, 1))
        pool.settle()
    server = build_server(scheduler, state / "sources")
    p1 = (ROOT / "problems" / "001_allreduce.py").read_text()

    async def session() -> None:
        async with Client(server) as client:
            for path in args.check_files if "check" in args.parts else []:
                source = path.read_text()
                name = (
                    str(path.resolve().relative_to(ROOT))
                    if path.resolve().is_relative_to(ROOT)
                    else str(path)
                )
                walls = []
                for i in range(args.check_repeats):
                    res, wall = await call(
                        client,
                        "run_correctness",
                        {
                            "problem": 1,
                            "source": source,
                            "world_size": ws,
                            "device": args.device,
                            "trials": 5,
                        },
                    )
                    walls.append(wall)
                    emit(
                        args.out,
                        {
                            "part": "check",
                            "file": name,
                            "repeat": i,
                            "verdict": res.get("verdict"),
                            "wall_s": round(wall, 3),
                            "message": res.get("message"),
                        },
                    )
                    await anyio.sleep(args.think_s)  # an agent's think time: the pool refills
                warm = walls[1:]
                emit(
                    args.out,
                    {
                        "part": "check-summary",
                        "file": name,
                        "first_s": round(walls[0], 3),
                        "warm_median_s": round(statistics.median(warm), 3) if warm else None,
                        "warm_min_s": round(min(warm), 3) if warm else None,
                    },
                )

            if "bench12" in args.parts:
                # on CPU (a dry run), problem 1's reference against itself
                pid, source = (
                    (12, (ROOT / "examples" / "012_allgather_gemm_overlap.py").read_text())
                    if cuda
                    else (1, p1)
                )
                speeds, walls = [], []
                for i in range(3):
                    res, wall = await call(
                        client,
                        "benchmark",
                        {
                            "problem": pid,
                            "source": source,
                            "world_size": ws,
                            "device": args.device,
                            "launches": args.launches,
                        },
                    )
                    speeds.append(res.get("speedup"))
                    walls.append(wall)
                    emit(
                        args.out,
                        {
                            "part": "bench12",
                            "problem": pid,
                            "launches": args.launches,
                            "repeat": i,
                            "verdict": res.get("verdict"),
                            "speedup": res.get("speedup"),
                            "wall_s": round(wall, 3),
                            "message": res.get("message"),
                        },
                    )
                ok = [s for s in speeds if s]
                if ok:
                    med = statistics.median(ok)
                    emit(
                        args.out,
                        {
                            "part": "bench12-summary",
                            "median_speedup": med,
                            "median_wall_s": round(statistics.median(walls), 3),
                            "max_dev_pct": max(abs(s / med - 1) * 100 for s in ok),
                        },
                    )

        if "throughput" in args.parts:
            await throughput()

        if "fidelity" in args.parts:
            async with Client(server) as client:
                ids = sorted(problems.suite())
                for rep in range(3):
                    for pid in ids:
                        if time.monotonic() - t_start > args.budget_s:
                            emit(args.out, {"part": "fidelity-stopped", "at": [rep, pid]})
                            return
                        p = problems.resolve(pid)
                        if p.world_size_error(ws, "pkb"):
                            continue
                        res, wall = await call(
                            client,
                            "benchmark",
                            {
                                "problem": pid,
                                "source": p.path.read_text(),
                                "world_size": ws,
                                "device": args.device,
                                "launches": args.launches,
                            },
                        )
                        emit(
                            args.out,
                            {
                                "part": "fidelity",
                                "call": rep,
                                "problem": pid,
                                "verdict": res.get("verdict"),
                                "speedup": res.get("speedup"),
                                "wall_s": round(wall, 3),
                                "message": res.get("message"),
                            },
                        )

    async def throughput() -> None:
        clients, per_client = 8, 5
        src = p1
        done: list[dict] = []
        t0 = time.perf_counter()

        async def one_client(c: int) -> None:
            async with Client(server) as client:
                for j in range(per_client):
                    res, wall = await call(
                        client,
                        "run_correctness",
                        {"problem": 1, "source": src, "world_size": 2, "device": args.device, "trials": 2},
                    )
                    done.append(
                        {
                            "client": c,
                            "job": j,
                            "verdict": res.get("verdict"),
                            "wall_s": round(wall, 3),
                            "end_s": round(time.perf_counter() - t0, 3),
                        }
                    )

        async with anyio.create_task_group() as tg:
            for c in range(clients):
                tg.start_soon(one_client, c)
        total = time.perf_counter() - t0
        finish = {c: max(d["end_s"] for d in done if d["client"] == c) for c in range(clients)}
        emit(
            args.out,
            {
                "part": "throughput",
                "clients": clients,
                "jobs": clients * per_client,
                "completed": len(done),
                "passed": sum(d["verdict"] == "pass" for d in done),
                "total_s": round(total, 2),
                "checks_per_min": round(len(done) / total * 60, 1),
                "client_finish_s": finish,
            },
        )

    try:
        anyio.run(session)
    finally:
        scheduler.stop()
        if pool is not None:
            pool.close()


if __name__ == "__main__":
    main()
