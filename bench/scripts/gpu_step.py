"""What a warm sandbox's GPU step costs, and whether its parts disturb a benchmark timed beside them.

    python3 bench/scripts/gpu_step.py --out gpu_step.jsonl [--counts 1,2,4,6] [--repeats 2]
        [--disturbers 6] [--seconds 3] [--docker] [--nccl-log DIR] [--anatomy-only]

A gated sandbox (sandbox/pool.py) imports torch and joins its store first, then, once opened, takes
its GPU step (harness/worker.py `_join_group`): the CUDA context, NCCL's communicators, one
collective. A benchmark waits for every sandbox still taking that step. This measures it with two
ranks a "sandbox", rank r on GPU r and on its GPU's block of cores (sandbox/cpus.py), each pair
plain processes or, with --docker, in a container of its own created as the Docker sandbox creates
a launch's (sandbox/docker.py `container_options`: no network, private IPC, read-only root):

  anatomy       K sandboxes staged, then let go at once, for each K of --counts: each rank's seconds
                from the go to its context, to its communicators, to its collective's end
  interference  a pair of ranks timing a 64 MiB all-reduce back to back (CUDA events, one call a
                sample) for --seconds, alone, then with --disturbers sandboxes let go 0.5 s in taking
                only their CUDA context ("context"), their context and communicators but no
                collective ("group"), the whole step ("step"), as --disturbances lists: the samples
                while they ran against the samples of the run alone

Rows (JSON lines, appended to --out): {"part": "anatomy", "k", "repeat", per step median and max,
"all_ready_s"} and {"part": "interference", "disturbance", "samples", "median_ms", "p90_ms",
"max_ms", "during": the same over the samples taken while the disturbers ran}; each row has
"backend". --nccl-log DIR: each rank's stderr with NCCL_DEBUG=INFO for its set-up (NCCL's own
"Init timings" split of its communicators), a file per rank under DIR.
Runs the project's own code only (no candidate). NVLink multicast stays off (sandbox/base.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from docker.types import Mount  # noqa: E402

from sandbox.base import LAUNCH_ENV  # noqa: E402
from sandbox.cpus import format_cpulist, parse_cpulist, rank_cpus  # noqa: E402

MOUNT = "/opt/pkb-root"  # the repository, read-only, in a --docker pair's container

STEPS = ("context", "group", "collective")
WAIT_S = 120.0


def _wait_for(path: Path, timeout_s: float = WAIT_S) -> None:
    give_up = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > give_up:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.005)


def worker(folder: Path, rank: int, mode: str, seconds: float, cpus: str) -> None:
    """One rank: stage, wait for the go file, take the GPU step (or only its context), report."""
    if cpus:
        os.sched_setaffinity(0, parse_cpulist(cpus))
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
    if mode not in ("context", "group"):
        dist.all_reduce(torch.ones(1, device=device))
        torch.cuda.synchronize()
        times["collective"] = time.time() - go
    result: dict[str, object] = {"rank": rank, **{f"{k}_s": round(v, 4) for k, v in times.items()}}
    if mode == "timer":
        result["samples"] = _time_all_reduce(torch, dist, device, seconds, folder)
    (folder / f"result{rank}.json").write_text(json.dumps(result))
    if mode == "group":  # both communicators made, no kernel run: wait for the peer's, not a barrier
        _wait_for(folder / f"result{1 - rank}.json")
    elif mode != "context":
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


NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}


class Pairs:
    """Starts a "sandbox": its two ranks as plain processes, or in a container of their own."""

    def __init__(self, docker: bool, nccl_log: bool) -> None:
        import torch

        self.nccl_log = nccl_log
        self.cpus = [format_cpulist(c) for c in rank_cpus("cuda", [0, 1], 2, torch.cuda.device_count())]
        self.backend = None
        if docker:
            from sandbox.docker import DockerBackend

            self.backend = DockerBackend()

    @property
    def name(self) -> str:
        return "docker" if self.backend is not None else "plain"

    def start(self, folder: Path, mode: str, seconds: float = 0.0) -> list[Any]:
        folder.mkdir(parents=True)
        if self.backend is None:
            return start_pair(folder, mode, seconds, self.cpus, self.nccl_log, {**os.environ, **LAUNCH_ENV})
        from sandbox.docker import LAUNCH_MOUNT

        cpus = tuple(tuple(parse_cpulist(c)) for c in self.cpus)
        options = self.backend.container_options(f"step-{folder.name}", folder, "cuda", [0, 1], 4, cpus, ROOT)
        options["mounts"].append(Mount(MOUNT, str(ROOT), type="bind", read_only=True))
        script = f"{MOUNT}/bench/scripts/gpu_step.py"
        command = [sys.executable, script, "--pair", LAUNCH_MOUNT, "--mode", mode, "--seconds", str(seconds)]
        command += ["--cpus", ";".join(self.cpus), *(["--log-nccl"] if self.nccl_log else [])]
        container = self.backend.client.containers.create(self.backend.image, command, **options)
        container.start()
        return [Container(container)]


class Container:
    """A pair's container, waited for like a process."""

    def __init__(self, container: Any) -> None:
        self.container = container

    def wait(self, timeout: float) -> int:
        try:
            return int(self.container.wait(timeout=timeout)["StatusCode"])
        finally:
            self.container.remove(force=True)


def start_pair(
    folder: Path, mode: str, seconds: float, cpus: list[str], nccl_log: bool, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """The pair's two ranks, rank r pinned to cpus[r]; with `nccl_log`, NCCL's set-up lines in
    rank{r}.log."""
    command = [sys.executable, __file__, "--worker", str(folder), "--mode", mode, "--seconds", str(seconds)]
    procs = []
    for r in range(2):
        log = open(folder / f"rank{r}.log", "wb") if nccl_log else None  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [*command, "--rank", str(r), "--cpus", cpus[r]],
                env={**env, **NCCL_LOG_ENV} if nccl_log else env,
                stdout=log,  # NCCL writes its lines to stdout
                stderr=subprocess.STDOUT if log is not None else None,
            )
        )
    return procs


def pair_main(folder: Path, mode: str, seconds: float, cpus: str, nccl_log: bool) -> None:
    """Inside a pair's container: its two ranks, then their worst exit status."""
    procs = start_pair(folder, mode, seconds, cpus.split(";"), nccl_log, {**os.environ})
    sys.exit(max(proc.wait() for proc in procs))


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


def _finish(procs: list[Any], folders: list[Path], nccl_log: Path | None = None) -> list[dict]:
    codes = [proc.wait(timeout=WAIT_S) for proc in procs]
    if nccl_log is not None:
        nccl_log.mkdir(parents=True, exist_ok=True)
        for f in folders:
            for r in range(2):
                if (f / f"rank{r}.log").exists():
                    shutil.copy(f / f"rank{r}.log", nccl_log / f"{f.parent.name}-{f.name}-rank{r}.log")
    if any(codes):
        raise RuntimeError(f"a rank exited with {max(codes)} (its stderr: --nccl-log)")
    return [json.loads((f / f"result{r}.json").read_text()) for f in folders for r in range(2)]


def anatomy(pairs: Pairs, scratch: Path, k: int, nccl_log: Path | None) -> dict:
    folders = [scratch / f"a{k}-{i}" for i in range(k)]
    procs = [p for f in folders for p in pairs.start(f, "step")]
    _staged(folders)
    _go(folders)
    results = _finish(procs, folders, nccl_log)
    row: dict[str, object] = {"part": "anatomy", "backend": pairs.name, "k": k}
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


def interference(pairs: Pairs, scratch: Path, disturbance: str, disturbers: int, seconds: float) -> dict:
    timer = scratch / f"t-{disturbance}"
    procs = pairs.start(timer, "timer", seconds)
    others = [scratch / f"d-{disturbance}-{i}" for i in range(disturbers if disturbance != "none" else 0)]
    mode = disturbance if disturbance in ("context", "group") else "step"
    procs_others = [p for f in others for p in pairs.start(f, mode)]
    _staged([timer, *others])
    _go([timer])
    _wait_for(timer / "timing")
    time.sleep(0.5)
    let_go = _go(others) if others else None
    results_others = _finish(procs_others, others) if others else []
    results = _finish(procs, [timer])
    samples = next(r["samples"] for r in results if r["rank"] == 0)
    row: dict[str, object] = {"part": "interference", "backend": pairs.name, "disturbance": disturbance}
    row["disturbers"] = len(others)
    row.update(_summary([ms for _, ms in samples]))
    if let_go is not None:
        last = {"context": "context_s", "group": "group_s"}.get(disturbance, "collective_s")
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
    parser.add_argument("--docker", action="store_true", help="each pair in a sandbox-like container")
    parser.add_argument("--nccl-log", type=Path, help="each rank's NCCL set-up lines, a file per rank")
    parser.add_argument("--anatomy-only", action="store_true")
    parser.add_argument("--disturbances", default="none,context,group,step")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pair", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--log-nccl", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.rank, args.mode, args.seconds, args.cpus)
        return
    if args.pair is not None:
        pair_main(args.pair, args.mode, args.seconds, args.cpus, args.log_nccl)
        return
    if args.out is None:
        parser.error("--out is required")
    pairs = Pairs(args.docker, args.nccl_log is not None)
    # a folder the sandbox user can enter (each pair's own is handed over to it)
    with tempfile.TemporaryDirectory(prefix="pkb-gpu-step-") as tmp:
        os.chmod(tmp, 0o755)
        scratch = Path(tmp)
        for repeat in range(args.repeats):
            folder = scratch / f"r{repeat}"
            for k in (int(c) for c in args.counts.split(",")):
                _write(args.out, {**anatomy(pairs, folder, k, args.nccl_log), "repeat": repeat})
            if args.anatomy_only:
                continue
            for disturbance in args.disturbances.split(","):
                row = interference(pairs, folder, disturbance, args.disturbers, args.seconds)
                _write(args.out, {**row, "repeat": repeat})


def _write(path: Path, row: dict) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
