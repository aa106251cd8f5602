"""Where a launch's time goes outside its ranks, from the service's logs (`--log` of turnaround.py or
build_speed.py: JSON lines).

    python3 bench/scripts/launch_steps.py LOG [LOG ...] [--all]

For each log, over its warm launches (`--all`: every launch): the launch's wall time, the time until
the launcher saw its last rank end (`ranks_ended_s`), and what is left (the hand-over, the launcher's
record, the sandbox's end, the host's reading), as median, quartiles and range; and each sandbox step
(`sandbox_steps_s`: handed_over, ended_cleanly or exited, logs_read, removed) as a median; and how
the warm sandboxes taken had warmed up (`warm.take` of a gated shape: when each ran, staged, was
opened and was ready, from its start), what their GPU step took (`gpu_step`: the CUDA context, the
communicators, the first collective), and how many were taken before they were ready. Prints one
JSON line per log.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "median": round(statistics.median(values), 3),
        "q1": round(q[0], 3),
        "q3": round(q[2], 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(path: Path, every: bool) -> dict:
    ends, takes = [], []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "launch.end" and (every or event.get("warm")):
            ends.append(event)
        if event.get("event") == "warm.take" and event.get("hit"):
            takes.append(event)
    steps: dict[str, list[float]] = {}
    for e in ends:
        for name, seconds in (e.get("sandbox_steps_s") or {}).items():
            steps.setdefault(name, []).append(seconds)
    return {
        "log": str(path),
        "launches": len(ends),
        "wall_s": spread([e["wall_s"] for e in ends]),
        "ranks_ended_s": spread([e["ranks_ended_s"] for e in ends if "ranks_ended_s" in e]),
        "outside_ranks_s": spread([e["wall_s"] - e["ranks_ended_s"] for e in ends if "ranks_ended_s" in e]),
        "sandbox_steps_s": {k: round(statistics.median(v), 3) for k, v in steps.items()},
        "warm_taken": len(takes),
        "warm_taken_unready": sum(not t.get("ready") for t in takes),
        "warm_up_s": {
            step: spread([t[f"{step}_s"] for t in takes if t.get(f"{step}_s") is not None])
            for step in ("running", "staged", "opened", "ready")
        },
        # what the GPU step took, where the sandbox's ranks said (its slowest rank's, per part)
        "gpu_step_s": {
            part: spread([t["gpu_step"][part] for t in takes if part in (t.get("gpu_step") or {})])
            for part in ("context_s", "group_s", "collective_s")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path, nargs="+")
    ap.add_argument("--all", action="store_true", help="every launch, not only warm ones")
    args = ap.parse_args()
    for path in args.logs:
        print(json.dumps(summarize(path, args.all)))


if __name__ == "__main__":
    main()
