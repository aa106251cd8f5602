"""Throughput of `pkb eval`: one node (this machine's scheduler) against a Ray cluster.

Runs the same batch twice with fresh stores: `pkb eval BATCH` (one node), then `pkb eval BATCH --ray
ADDRESS`, and prints files per minute and the wall time of each, as JSON lines and a Markdown row.
Without --ray, it starts a local cluster of --nodes nodes with --gpus-per-node logical GPUs each
(ray.cluster_utils; on one machine, so it measures the cluster path's overhead, not added hardware).

    python bench/scripts/ray_throughput.py examples/original --device cpu --world-size 2 --no-bench
    python bench/scripts/ray_throughput.py BATCH --device cuda --world-size 2 --ray HEAD:6379   # GPUs

Throughput = files finished (any outcome) / wall seconds of the `pkb eval` command, x 60.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_eval(batch: str, extra: list[str], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="pkb-tput-") as tmp:
        cmd = [sys.executable, "-m", "pkb_mcp", "eval", batch, "--device", args.device]
        cmd += ["--world-size", str(args.world_size), "--trials", str(args.trials)]
        cmd += ["--timeout", str(args.timeout), "--sandbox", args.sandbox, "--json"]
        cmd += ["--store", f"{tmp}/eval.sqlite", "--out", f"{tmp}/out", *extra]
        if args.no_bench:
            cmd.append("--no-bench")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
    try:
        report = json.loads(done.stdout)
    except ValueError:
        sys.exit(f"pkb eval failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    outcomes: dict[str, int] = {}
    for r in report["results"]:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    files = len(report["results"])
    per_min = round(60 * files / wall, 2)
    return {"files": files, "wall_s": round(wall, 1), "files_per_min": per_min, **outcomes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch")
    p.add_argument("--ray", default=None, help="an existing cluster's address (default: start a local one)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--cpus-per-node", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--sandbox", default="process")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--skip-one-node", action="store_true", help="only the cluster run")
    args = p.parse_args()

    rows = []
    if not args.skip_one_node:
        rows.append({"where": "one node", **run_eval(args.batch, [], args)})
        print(json.dumps(rows[-1]), flush=True)
    cluster = None
    address = args.ray
    if address is None:
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus_per_node, num_gpus=args.gpus_per_node)
        cluster.wait_for_nodes()
        address = cluster.address
    try:
        where = f"Ray cluster at {args.ray}" if args.ray else f"local Ray cluster, {args.nodes} nodes"
        rows.append({"where": where, **run_eval(args.batch, ["--ray", address], args)})
        print(json.dumps(rows[-1]), flush=True)
    finally:
        if cluster is not None:
            cluster.shutdown()
    print("\n| where | files | wall s | files/min |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['where']} | {r['files']} | {r['wall_s']} | {r['files_per_min']} |")


if __name__ == "__main__":
    main()
