"""What a warm sandbox's GPU step costs, and whether its parts disturb a benchmark timed beside them.

    python3 docs/scripts/gpu_step.py --out gpu_step.jsonl [--counts 1,2,4,6] [--repeats 2]
        [--disturbers 6] [--seconds 3]

A gated sandbox (sandbox/pool.py) imports torch and joins its store first, then, once opened, takes
its GPU step (harness/worker.py `_join_group`): the CUDA context, NCCL's communicators, one
collective. A benchmark waits for every sandbox still taking that step. This measures, with plain
processes (no container: the step is the same), two ranks a "sandbox", rank r on GPU r:

  anatomy       K sandboxes staged, then let go at once, for each K of --counts: each rank's seconds
                from the go to its context, to its communicators, to its collective's end
  interference  a pair of ranks timing a 64 MiB all-reduce back to back (CUDA events, one call a
                sample) for --seconds, alone, then with --disturbers sandboxes let go 0.5 s in taking
                only their CUDA context, then taking the whole step: the samples while they ran
                against the samples of the run alone

Rows (JSON lines, appended to --out): {"part": "anatomy", "k", "repeat", per step median and max,
"all_ready_s"} and {"part": "interference", "disturbance", "samples", "median_ms", "p90_ms",
"max_ms", "during": the same over the samples taken while the disturbers ran}.
Runs the project's own code only (no candidate). NVLink multicast stays off (sandbox/base.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox.base import LAUNCH_ENV  # noqa: E402

STEPS = ("context", "group", "collective")
WAIT_S = 120.0


def _wait_for(path: Path, timeout_s: float = WAIT_S) -> None:
    give_up = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > give_up:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.005)


def worker(folder: Path, rank: int, mode: str, seconds: float) -> None:
    """One rank: stage, wait for the go file, take the GPU step (or only its context), report."""
    import torch
    import torch.distributed as dist

    store = dist.FileStore(str(folder / "store"), 2)
    (folder / f"staged{rank}").write_text("")
    _wait_for(folder / "go")
    go = float((folder / "go").read_text() or time.time())
    times: dict[str, float] = {}
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    times["context"] = time.time() - go
    if mode != "context":
        dist.init_process_group("nccl", store=store, rank=rank, world_size=2, device_id=device)
        times["group"] = time.time() - go
        dist.all_reduce(torch.ones(1, device=device))
        torch.cuda.synchronize()
        times["collective"] = time.time() - go
    result: dict[str, object] = {"rank": rank, **{f"{k}_s": round(v, 4) for k, v in times.items()}}
    if mode == "timer":
        result["samples"] = _time_all_reduce(torch, dist, device, seconds, folder)
    (folder / f"result{rank}.json").write_text(json.dumps(result))
    if mode != "context":
        dist.barrier()
    os._exit(0)


def _time_all_reduce(torch, dist, device, seconds: float, folder: Path) -> list[list[float]]:  # type: ignore[no-untyped-def]
    """[host time at the call, its milliseconds] for back-to-back 64 MiB all-reduces."""
    x = torch.ones(16 << 20, device=device)
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    began = time.time()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    # both ranks make the same number of calls: rank 0's estimate of what fits in `seconds`
    calls = torch.tensor([int(seconds / max((time.time() - began) / 20, 1e-6))], device=device)
    dist.broadcast(calls, 0)
    if dist.get_rank() == 0:
        (folder / "timing").write_text(str(time.time()))
    samples: list[list[float]] = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(int(calls.item())):
        at = time.time()
        start.record()
        dist.all_reduce(x)
        end.record()
        end.synchronize()
        samples.append([at, start.elapsed_time(end)])
    return samples


def _env() -> dict[str, str]:
    return {**os.environ, **LAUNCH_ENV}


def _start(folder: Path, mode: str, seconds: float = 0.0) -> list[subprocess.Popen[bytes]]:
    folder.mkdir(parents=True)
    command = [sys.executable, __file__, "--worker", str(folder), "--mode", mode, "--seconds", str(seconds)]
    return [subprocess.Popen([*command, "--rank", str(r)], env=_env()) for r in range(2)]


def _staged(folders: list[Path]) -> None:
    for folder in folders:
        for r in range(2):
            _wait_for(folder / f"staged{r}")


def _go(folders: list[Path]) -> float:
    now = time.time()
    for folder in folders:
        (folder / "go.part").write_text(repr(now))
        os.replace(folder / "go.part", folder / "go")
    return now


def _finish(procs: list[subprocess.Popen[bytes]], folders: list[Path]) -> list[dict]:
    for proc in procs:
        if proc.wait(timeout=WAIT_S) != 0:
            raise RuntimeError(f"a rank exited with {proc.returncode}")
    return [json.loads((f / f"result{r}.json").read_text()) for f in folders for r in range(2)]


def anatomy(scratch: Path, k: int) -> dict:
    folders = [scratch / f"a{k}-{i}" for i in range(k)]
    procs = [p for f in folders for p in _start(f, "step")]
    _staged(folders)
    _go(folders)
    results = _finish(procs, folders)
    row: dict[str, object] = {"part": "anatomy", "k": k}
    for step in STEPS:
        values = [r[f"{step}_s"] for r in results]
        row[f"{step}_median_s"] = round(statistics.median(values), 3)
        row[f"{step}_max_s"] = round(max(values), 3)
    row["all_ready_s"] = row["collective_max_s"]
    return row


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "samples": len(ordered),
        "median_ms": round(statistics.median(ordered), 4),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "max_ms": round(ordered[-1], 4),
    }


def interference(scratch: Path, disturbance: str, disturbers: int, seconds: float) -> dict:
    timer = scratch / f"t-{disturbance}"
    procs = _start(timer, "timer", seconds)
    others = [scratch / f"d-{disturbance}-{i}" for i in range(disturbers if disturbance != "none" else 0)]
    mode = "context" if disturbance == "context" else "step"
    procs_others = [p for f in others for p in _start(f, mode)]
    _staged([timer, *others])
    _go([timer])
    _wait_for(timer / "timing")
    time.sleep(0.5)
    let_go = _go(others) if others else None
    results_others = _finish(procs_others, others) if others else []
    results = _finish(procs, [timer])
    samples = next(r["samples"] for r in results if r["rank"] == 0)
    row: dict[str, object] = {"part": "interference", "disturbance": disturbance, "disturbers": len(others)}
    row.update(_summary([ms for _, ms in samples]))
    if let_go is not None:
        last = "context_s" if disturbance == "context" else "collective_s"
        ended = let_go + max(r[last] for r in results_others)
        row["disturbed_s"] = round(ended - let_go, 3)
        during = [ms for at, ms in samples if let_go <= at <= ended]
        row["during"] = _summary(during) if during else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--counts", default="1,2,4,6")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--disturbers", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.rank, args.mode, args.seconds)
        return
    if args.out is None:
        parser.error("--out is required")
    with tempfile.TemporaryDirectory(prefix="pkb-gpu-step-") as tmp:
        scratch = Path(tmp)
        for repeat in range(args.repeats):
            folder = scratch / f"r{repeat}"
            for k in (int(c) for c in args.counts.split(",")):
                _write(args.out, {**anatomy(folder, k), "repeat": repeat})
            for disturbance in ("none", "context", "step"):
                row = interference(folder, disturbance, args.disturbers, args.seconds)
                _write(args.out, {**row, "repeat": repeat})


def _write(path: Path, row: dict) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
