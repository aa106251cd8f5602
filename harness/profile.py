"""A profile of one solution on every rank, run inside the worker (torch + stdlib only).

The worker's launch mode `profile` comes here with the solution and its inputs. The rank warms the
solution up as the benchmark does, then runs `calls` + 1 calls under torch.profiler (CPU activity,
plus CUDA through CUPTI on GPUs), each one aligned across ranks by `harness.timing.Timer` exactly as
a timed call is, with the call itself inside `record_function("pkb.call#<i>")`. The first profiled
call is the profiler's warm-up step and is discarded (CUPTI's start-up costs land in it).

Each rank writes into `profile/` of the launch directory:
  r{rank}.trace.json   torch's Chrome trace export of the profiled calls
  r{rank}.info.json    a ProfileInfo (harness/contracts.py): the device-event milliseconds of each
                       call; on rank 0, why hardware counters (Nsight Compute) cannot be read here
The host reads both as untrusted input (pkb_mcp/profiling/traces.py): nothing here is a verdict or a credit.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.contracts import ProfileInfo, TimingConfig

CALL_LABEL = "pkb.call#"
PROFILE_DIR = "profile"
PROBE_CALLS = 5
NVIDIA_PARAMS = Path("/proc/driver/nvidia/params")


def _effective_capabilities() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def counters_unavailable(device_type: str) -> str:
    """Why per-kernel hardware counters (Nsight Compute) cannot be read in this sandbox."""
    if device_type != "cuda":
        return "the launch ran on CPU"
    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not on the sandbox's PATH"
    try:
        admin_only = "RmProfilingAdminOnly: 1" in NVIDIA_PARAMS.read_text()
    except OSError:
        admin_only = True  # unknown: assume the driver's default
    if admin_only and _effective_capabilities() in (0, None):
        return (
            "the driver restricts performance counters to administrators (RmProfilingAdminOnly) and "
            "the sandbox runs without capabilities"
        )
    return "ncu is available, but pkb does not run it yet"


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def run(
    solution: Callable[..., Any],
    next_inputs: Callable[[], tuple],
    device: Any,
    cfg: TimingConfig,
    launch_dir: Path,
    rank: int,
    after_call: Callable[[], None],
) -> None:
    """Warm up, profile `cfg["calls"]` aligned calls, write this rank's trace and info files.

    `next_inputs()` gives the arguments of the next call (fresh copies for problems that mutate their
    inputs); it runs outside the profiled range. `after_call()` runs after every call (the worker
    checks there that the solution replaced nothing)."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from harness import timing

    calls = max(1, int(cfg.get("calls", 3)))
    timer = timing.Timer(device, int(cfg.get("l2_bytes", 0)))

    def one(label: str | None = None) -> float:
        inputs = next_inputs()

        def call() -> Any:
            if label is None:
                return solution(*inputs)
            with record_function(label):
                return solution(*inputs)

        out, device_ms, _ = timer.time(call)
        del out
        after_call()
        return device_ms

    # Warm-up as in harness.timing.run_timing: probe calls, then enough calls to cover warmup_ms,
    # sized from the slowest rank; then the alignment sleep from the slowest rank's enqueue time.
    probe = [one() for _ in range(PROBE_CALLS)]
    per_call = max(timing.max_over_ranks([statistics.median(probe)], device)[0], 1e-3)
    warmup = int(min(max(float(cfg.get("warmup_ms", 20.0)) / per_call, 3), int(cfg.get("max_warmup", 50))))
    enqueue = []
    for _ in range(warmup):
        one()
        enqueue.append(timer.enqueue_ms)
    slowest = timing.max_over_ranks([statistics.median(enqueue)], device)[0]
    timer.sleep_us = min(max(2e3 * slowest + timing.MIN_SLEEP_US, timer.min_sleep_us), timing.MAX_SLEEP_US)

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    event_ms: list[float] = []
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=calls, repeat=1),
        record_shapes=False,
        profile_memory=False,
        with_stack=False,
    ) as prof:
        for i in range(calls + 1):
            ms = one(f"{CALL_LABEL}{i}")
            if i:
                event_ms.append(ms)
            prof.step()
    out_dir = launch_dir / PROFILE_DIR
    out_dir.mkdir(exist_ok=True)
    prof.export_chrome_trace(str(out_dir / f"r{rank}.trace.json"))
    info: ProfileInfo = {
        "rank": rank,
        "calls": calls,
        "warmup_calls": PROBE_CALLS + warmup + 1,
        "event_ms": event_ms,
        "alignment_sleep_us": timer.sleep_us if device.type == "cuda" else 0.0,
    }
    if rank == 0:
        info["counters"] = counters_unavailable(device.type)
    _write_json(out_dir / f"r{rank}.info.json", info)
