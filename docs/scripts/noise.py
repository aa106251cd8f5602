"""Where the spread of identical code comes from: within one set of processes, or between them.

A benchmark times the reference and the candidate in separate jobs (separate processes). On 2 H200s
the medians of identical code then differ by up to 5.1% (docs/gpu-results.md, run F), although the
samples within each job are tight. This script runs each problem's reference in PROCESSES separate
jobs, and within each job times it ROUNDS times, each round with the
whole budget of a benchmark's side (the job's placements, in the harness's terms, without sharing
one budget). Then, per problem (log scale, so the figures are relative):

  within   spread of the round medians inside one job (pooled over jobs): what the same processes
           give at another moment (GPU clocks, the node's state)
  between  spread of the jobs' first-round medians: what a benchmark sees for one side
  jobs     spread of the jobs' mean over rounds: what stays with the processes however long they run

If `between` is about `within`, the spread is a matter of the moment, and alternating reference and
candidate rounds inside their two jobs would cancel it. If `jobs` stays near `between`, the spread
belongs to the processes (run F: it does). `--move-memory` then tests whether it is where their
memory landed: every round after the first gets its inputs and the solution's buffers at new device
addresses. If `within` then grows to about `between`, a benchmark can sample several placements
per side inside its two jobs instead of paying for more jobs (`bench(placements=P)`,
docs/plan-fidelity.md). On 4 H200s it did not (run G): placements spread 0.3-0.5%, jobs 1.4-1.8%.

The other things a process keeps, each with a switch:
  --pin-cpus / --no-pin-cpus   each rank on CPU cores of its own, the same in every job, or wherever
                               the kernel puts it (PKB_PIN_CPUS; the default pins GPU jobs). If jobs
                               stop spreading when pinned, the cores were what they kept.
  --min-sleep-us US            a longer alignment sleep before each timed call (harness/timing.py):
                               if jobs then agree, host launch work was leaking into device time.

    python3 docs/scripts/noise.py --out noise.jsonl [--problems 1,17,23,40,47,86] [--world-size 2]
`--device cpu` is a dry run (gloo, small counts) for machines without GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pkb_mcp import config, problems, service, stats  # noqa: E402
from pkb_mcp.launches import LaunchRequest, run_launch  # noqa: E402
from sandbox import select_backend  # noqa: E402
from sandbox.cpus import format_cpulist  # noqa: E402


def deciles(samples: list[float]) -> list[float]:
    """The nine deciles of a job's samples, in ms (empty for fewer than ten samples)."""
    if len(samples) < 10:
        return []
    return [round(q, 5) for q in statistics.quantiles(samples, n=10)]


def spread_pct(values: list[float]) -> float:
    """Standard deviation of log(values), in percent."""
    return (stats.log_spread(values) or 0.0) * 100


def pooled_within_pct(jobs: list[list[float]]) -> float:
    """Pooled standard deviation of log(round medians) inside each job, in percent."""
    num = den = 0.0
    for rounds in jobs:
        if len(rounds) > 1:
            logs = [math.log(v) for v in rounds]
            mean = statistics.fmean(logs)
            num += sum((x - mean) ** 2 for x in logs)
            den += len(logs) - 1
    return math.sqrt(num / den) * 100 if den else 0.0


def summarize(problem: int, jobs: list[list[float]]) -> dict:
    return {
        "part": "summary",
        "problem": problem,
        "jobs": len(jobs),
        "rounds": min(len(r) for r in jobs),
        "within_pct": round(pooled_within_pct(jobs), 3),
        "between_pct": round(spread_pct([r[0] for r in jobs]), 3),
        "jobs_pct": round(spread_pct([math.exp(statistics.fmean(math.log(v) for v in r)) for r in jobs]), 3),
        "median_ms": statistics.median(v for r in jobs for v in r),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("noise.jsonl"))
    ap.add_argument("--problems", default="1,17,23,40,47,86")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--size", default="pkb")
    ap.add_argument("--processes", type=int, default=4, help="separate jobs per problem")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds inside each job")
    ap.add_argument("--move-memory", action="store_true", help="new device addresses every round")
    ap.add_argument("--pin-cpus", action=argparse.BooleanOptionalAction, default=None, help="see above")
    ap.add_argument("--min-sleep-us", type=float, default=None, help="alignment sleep at least this")
    ap.add_argument("--seed", type=int, default=None, help="one input seed for every job (else each its own)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--sandbox", default="auto", choices=["auto", "docker", "process"])
    args = ap.parse_args()
    if args.processes < 2 or args.rounds < 2:
        ap.error("--processes and --rounds must each be at least 2: the spreads need two of each")
    if args.pin_cpus is not None:
        os.environ["PKB_PIN_CPUS"] = "1" if args.pin_cpus else "0"
    backend = select_backend(args.sandbox)
    base = service.timing_config(args.device)
    # Each round is one of the job's placements, with a whole benchmark side's budget (a benchmark
    # shares one budget out between its placements).
    tcfg = {
        **base,
        **{
            k: base[k] * args.rounds
            for k in ("warmup_ms", "max_warmup", "budget_ms", "min_span_ms", "max_samples")
        },
        "placements": args.rounds,
        "move_memory": args.move_memory,
    }
    if args.min_sleep_us is not None:
        tcfg["min_sleep_us"] = args.min_sleep_us
    gpus = list(range(args.world_size)) if args.device == "cuda" else []
    with open(args.out, "a") as out:

        def emit(row: dict) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)

        pinned = config.pin_cpus(args.device)
        emit(
            {
                "part": "machine",
                "backend": backend.name,
                "argv": sys.argv[1:],
                "timing": tcfg,
                "pinned": pinned,
            }
        )
        for pid in [int(x) for x in args.problems.split(",") if x]:
            p = problems.resolve(pid)
            if (why := p.world_size_error(args.world_size, args.size)) is not None:
                emit({"part": "skipped", "problem": pid, "why": why})
                continue
            jobs: list[list[float]] = []
            for j in range(args.processes):
                t0 = time.perf_counter()
                outcome = run_launch(
                    LaunchRequest(
                        mode="benchmark",
                        problem_path=p.path,
                        solution_path=p.path,
                        world_size=args.world_size,
                        device=args.device,
                        gpus=gpus,
                        size=p.size(args.size),
                        dtype=p.dtype,
                        seeds=[secrets.randbits(62) if args.seed is None else args.seed],
                        tolerance=p.tolerance,
                        timeout_s=300.0,
                        timing=tcfg,
                    ),
                    backend,
                )
                medians = (outcome.timing or {}).get("placement_medians_ms")
                if not outcome.ok or not medians:
                    failed = [f"rank {r.rank}: {r.state} {r.error}" for r in outcome.ranks if r.state != "ok"]
                    emit({"part": "job", "problem": pid, "job": j, "ok": False, "why": failed[:2]})
                    break
                jobs.append([float(m) for m in medians])
                emit(
                    {
                        "part": "job",
                        "problem": pid,
                        "job": j,
                        "ok": True,
                        "round_medians_ms": medians,
                        "round_samples": (outcome.timing or {}).get("placement_samples"),
                        "mismatches": len((outcome.timing or {}).get("timed_output_mismatches", [])),
                        # the shape of the job's samples: whether a job differs from another by a
                        # few slow samples or as a whole
                        "deciles_ms": deciles((outcome.timing or {}).get("device_ms") or []),
                        "rank_cpus": [format_cpulist(r.cpus) for r in outcome.ranks],
                        "wall_s": round(time.perf_counter() - t0, 2),
                    }
                )
            if len(jobs) >= 2:
                emit(summarize(pid, jobs))


if __name__ == "__main__":
    main()
