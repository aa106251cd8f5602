"""A plain check's wall time in the process backend, with and without its fork server; and with
`--steps`, a plain `pkb check` split into its steps in each sandbox backend.

    python3 bench/scripts/check_latency.py [--checks 6] [--world-size 2] [--device cpu]
    python3 bench/scripts/check_latency.py --steps [--checks 4] [--backends docker process] [--out F]

Without --steps: `--checks` checks (one trial) of problem 1's reference as the candidate through the
service in one process, as a server or a test session does, first with the fork server
(harness/forkserver.py: torch imported once, every launcher and rank a fork), then with every launcher
and rank a new interpreter. The first check of each kind is reported apart (it starts the fork
server). Prints one JSON line per mode: each check's wall seconds and their median.

With --steps: `pkb check 1 problems/001_allreduce.py --world-size 2 --device cpu --sandbox B`, as a
newcomer types it (five trials and the unseen-size trial: a check's defaults), `--checks` times per
backend, the backends taking turns. Each line the command writes on stderr (its info-level log and
its progress lines) is stamped as it arrives, and each check is split into:

  before_launches   the command's start to its first launch: the interpreter, pkb's and torch's
                    imports, the sandbox backend (Docker: the engine, the image, the sweep), the run's
                    set-up (problem, pairing, static report)
  launches          the first launch's start to the last one's end (Docker runs a check's launches
                    side by side; the process backend one after another); of the slowest launch:
                    container (its creation and start: the engine), rank_process (a rank's process
                    from its start to its first line of pkb's: a new interpreter and its imports, or a
                    fork), rendezvous (the TCP store, the process group and one collective), run (the
                    launch's stages: problem, solution, trials, teardown), rest (the launcher's start
                    and imports, its record, the host's wait and reading)
  judging           the last launch's end to the last progress line (the verdict, the unseen trial's)
  exit              that line to the command's exit (the result printed, containers removed,
                    the interpreter's end)

Prints (and appends to --out) one JSON line per check, and a summary per backend: each step's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pkb_mcp import problems, service  # noqa: E402
from pkb_mcp.models import RunRequest  # noqa: E402
from sandbox import process  # noqa: E402


class _NoForkServer:
    def launch(self, *args: object) -> None:
        return None


def measure(checks: int, world_size: int, device: str) -> list[float]:
    reference = problems.resolve(1).path
    walls = []
    for _ in range(checks):
        t0 = time.monotonic()
        result = service.check(
            RunRequest(
                problem=1, path=reference, world_size=world_size, device=device, trials=1, sandbox="process"
            )
        )
        walls.append(round(time.monotonic() - t0, 3))
        if result.verdict != "pass":
            raise SystemExit(f"the reference did not pass itself: {result.message}")
    return walls


def _stamped_lines(argv: list[str]) -> tuple[list[tuple[float, str]], float, int]:
    """Run `argv`; each stderr line with the seconds from the start at which it arrived, the wall
    seconds and the exit status."""
    import subprocess

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stderr]
    code = proc.wait()
    return lines, time.monotonic() - t0, code


def split(lines: list[tuple[float, str]], wall: float) -> dict:
    """One check's steps (module docstring) from its stamped stderr lines."""
    starts, ends = [], []
    progress = [at for at, text in lines if text.lstrip().startswith("[")]
    for at, text in lines:
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if event.get("event") == "launch.start":
            starts.append(at)
        elif event.get("event") == "launch.end":
            ends.append((at, event))
    if not starts or not ends:
        raise SystemExit(f"the check launched nothing: {lines[-5:]}")
    slowest = max((event for _, event in ends), key=lambda e: e["wall_s"])
    last_end = max(at for at, _ in ends)
    startup = slowest.get("startup_s") or {}
    launch = {
        "wall": slowest["wall_s"],
        "container": (slowest.get("sandbox_steps_s") or {}).get("handed_over", 0.0),
        "rank_process": startup.get("process", 0.0),
        "rendezvous": startup.get("group", 0.0),
        "run": round(sum((slowest.get("stages_s") or {}).values()), 3),
    }
    launch["rest"] = round(launch["wall"] - sum(v for k, v in launch.items() if k != "wall"), 3)
    judged = max(progress) if progress else last_end
    return {
        "wall_s": round(wall, 3),
        "before_launches_s": round(min(starts), 3),
        "launches_s": round(last_end - min(starts), 3),
        "launches": len(ends),
        "slowest_launch_s": launch,
        "judging_s": round(max(judged - last_end, 0.0), 3),
        "exit_s": round(wall - max(judged, last_end), 3),
    }


def steps(args: argparse.Namespace) -> int:
    """--steps: each backend's plain `pkb check`, split (module docstring)."""
    rows: dict[str, list[dict]] = {b: [] for b in args.backends}
    argv = [sys.executable, "-m", "pkb_mcp", "--log-level", "info", "check", "1", "problems/001_allreduce.py"]
    argv += ["--world-size", str(args.world_size), "--device", args.device, "--sandbox"]
    for n in range(args.checks):
        for backend in args.backends:
            lines, wall, code = _stamped_lines([*argv, backend])
            if code != 0:
                raise SystemExit(f"pkb check in {backend} exited {code}: {[t for _, t in lines[-5:]]}")
            row = {"backend": backend, "n": n, **split(lines, wall)}
            rows[backend].append(row)
            _emit(args.out, row)
    for backend, found in rows.items():
        later = found[1:] or found  # the first check of a session pulls files into the page cache

        def median(key: str, part: str | None = None, runs: list[dict] = later) -> float:
            values = [r[part][key] if part else r[key] for r in runs]
            return round(statistics.median(values), 3)

        summary = {k: median(k) for k in ("wall_s", "before_launches_s", "launches_s", "judging_s", "exit_s")}
        summary["slowest_launch_s"] = {k: median(k, "slowest_launch_s") for k in found[0]["slowest_launch_s"]}
        _emit(
            args.out,
            {"backend": backend, "summary": "median of the checks after the first", "checks": len(found),
             "walls_s": [r["wall_s"] for r in found], "cpus": os.cpu_count(), "load": os.getloadavg(),
             **summary},
        )  # fmt: skip
    return 0


def _emit(out: Path | None, row: dict) -> None:
    row = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}
    if out is not None:
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checks", type=int, default=6)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", action="store_true", help="split a plain `pkb check` per backend")
    parser.add_argument("--backends", nargs="+", default=["docker", "process"])
    parser.add_argument("--out", type=Path, help="--steps: append its JSON lines here too")
    args = parser.parse_args()
    if args.steps:
        return steps(args)
    for mode in ("fork server", "new interpreters"):
        if mode == "new interpreters":
            process.ProcessBackend._fork_server = lambda self, root: _NoForkServer()  # type: ignore[method-assign,assignment,return-value]
        walls = measure(args.checks, args.world_size, args.device)
        row = {"mode": mode, "world_size": args.world_size, "device": args.device, "first_s": walls[0]}
        row.update({"then_s": walls[1:], "median_then_s": statistics.median(walls[1:] or walls)})
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
