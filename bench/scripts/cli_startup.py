"""How long the `pkb` command takes to answer the commands that run nothing, and whether it imports torch.

    python3 bench/scripts/cli_startup.py [--runs 5] [--root DIR] [--label NAME]

Runs each command as a new interpreter, `python -m pkb_mcp ARGS` in `--root` (default: this tree; any
checkout of pkb-mcp, so that an older commit's figures can be taken the same way), once unmeasured (the
file cache and the bytecode written), then `--runs` times. Its wall seconds are from the start of the
child to its exit, as a person at a shell waits for them. One more run under `-X importtime` says
whether the command imported torch. First, the same for `python -c pass`: the interpreter's own start,
below which no command can go. Prints one JSON line per command: each run's wall seconds, their median,
`torch`, and the machine's 1-minute load average before the runs (`load`). The load is part of the
figure: take them on a quiet machine, or compare two trees in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# each command's name in the output, and the interpreter's arguments that run it
COMMANDS = {
    "python -c pass": ("-c", "pass"),
    "pkb --help": ("-m", "pkb_mcp", "--help"),
    "pkb problems": ("-m", "pkb_mcp", "problems"),
    "pkb show 1": ("-m", "pkb_mcp", "show", "1"),
}


def run(root: Path, args: tuple[str, ...], importtime: bool = False) -> tuple[float, str]:
    """One `python ARGS` in `root`, with `root` on the path: its wall seconds and its stderr."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    flags = ["-X", "importtime"] if importtime else []
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *flags, *args],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} exited {done.returncode}: {done.stderr[-500:]}")
    return wall, done.stderr


def imports_torch(stderr: str) -> bool:
    """Whether `-X importtime`'s lines name the module torch itself."""
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in stderr.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--root", type=Path, default=ROOT, help="the pkb-mcp tree to run (default: this one)")
    parser.add_argument("--label", default=None, help="the tree's name in the output (default: its commit)")
    args = parser.parse_args()
    root = args.root.resolve()
    label = (
        args.label
        or subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
    for command, argv in COMMANDS.items():
        load = round(os.getloadavg()[0], 2)
        run(root, argv)  # unmeasured: the file cache and the bytecode
        walls = [round(run(root, argv)[0], 3) for _ in range(args.runs)]
        torch = imports_torch(run(root, argv, importtime=True)[1])
        line = {"tree": label, "command": command, "median_s": statistics.median(walls), "walls_s": walls}
        print(json.dumps({**line, "torch": torch, "load": load, "cpus": os.cpu_count()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
