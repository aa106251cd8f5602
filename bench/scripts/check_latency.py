"""A plain check's wall time in the process backend, with and without its fork server.

    python3 bench/scripts/check_latency.py [--checks 6] [--world-size 2] [--device cpu]

Runs `--checks` checks (one trial) of problem 1's reference as the candidate through the service in
one process, as a server or a test session does, first with the fork server (harness/forkserver.py:
torch imported once, every launcher and rank a fork), then with every launcher and rank a new
interpreter. The first check of each kind is reported apart (it starts the fork server). Prints one
JSON line per mode: each check's wall seconds and their median.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checks", type=int, default=6)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
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
