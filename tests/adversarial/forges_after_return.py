"""Rewrites the harness's result files after the harness wrote them, from a thread and from a
double-forked process meant to outlive its rank:
  - every output file again, without the aliasing and mutation flags;
  - the timing record, with 0.000123 ms samples;
  - the launcher's report, every rank ok.

With RETURN_INPUT (as committed) it all-reduces in place and returns its input (no allocation, but
aliased and mutated), and the rewritten output files hide that. Expected: check fails: either the
rewrite is caught (every result file carries a keyed digest that the host checks: "altered after
the harness wrote it") or it came too late and the aliasing is reported.

With RETURN_INPUT = False (the timing variant the tests derive) the answer is right and only the
timing record is worth forging. Expected: bench fails ("timing record ... altered") or passes with
the harness's own figures (the worker kills its descendants and ends its threads at exit); never
with a forged sample.
"""

import json
import os
import threading
import time
from pathlib import Path

import torch.distributed as dist

FORGED_MS = 0.000123
RETURN_INPUT = True
_started = []


def _forge_once(job: Path, done: dict) -> None:
    from harness import tensorfile

    out = job / "out"
    if RETURN_INPUT and out.is_dir():  # the output files are worth forging only to hide the aliasing
        for path in sorted(out.glob("*.pkbt")):
            try:
                stamp = path.stat().st_mtime_ns
                if done.get(path.name) == stamp:
                    continue
                structure, tensors, meta = tensorfile.load(path, 1 << 30)
                meta = {k: v for k, v in meta.items() if k not in ("aliased_outputs", "mutated_inputs")}
                tensorfile.save(path, tensors, structure, meta)
                done[path.name] = path.stat().st_mtime_ns
            except (OSError, ValueError):
                continue
    timing = job / "timing.json"
    if timing.is_file():
        try:
            record = json.loads(timing.read_text())
            if record.get("device_ms", [None])[0] != FORGED_MS:
                n = len(record["device_ms"])
                record.update(device_ms=[FORGED_MS] * n, wall_ms=[FORGED_MS] * n)
                record.pop("mac", None)
                timing.write_text(json.dumps(record))
        except (OSError, ValueError, KeyError):
            pass
    launch = job / "launch.json"
    if launch.is_file():
        try:
            report = json.loads(launch.read_text())
            if any(r.get("state") != "ok" for r in report["ranks"]):
                for r in report["ranks"]:
                    r["state"] = "ok"
                launch.write_text(json.dumps(report))
        except (OSError, ValueError, KeyError):
            pass


def _loop(job: Path, seconds: float) -> None:
    done: dict = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _forge_once(job, done)
        time.sleep(0.001)


def _start(job: Path) -> None:
    threading.Thread(target=_loop, args=(job, 600.0), daemon=True).start()
    if os.fork() == 0:  # child: fork again so the grandchild is nobody's child
        try:
            os.setsid()
            if os.fork() == 0:
                _loop(job, 120.0)
        finally:
            os._exit(0)


def solution(x):
    if not _started:
        _started.append(True)
        _start(Path.cwd())
    if RETURN_INPUT:
        dist.all_reduce(x)
        return x
    out = x.clone()
    dist.all_reduce(out)
    return out
