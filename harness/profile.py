"""A profile of one solution on every rank, run inside the worker (torch + stdlib only).

The worker's launch mode `profile` comes here with the solution and its inputs. The rank warms the
solution up as the benchmark does, then runs `calls` + 1 calls under torch.profiler (CPU activity,
plus CUDA through CUPTI on GPUs), each one aligned across ranks by `harness.timing.Timer` exactly as
a timed call is, with the call itself inside `record_function("pkb.call#<i>")`. The first profiled
call is the profiler's warm-up step and is discarded (CUPTI's start-up costs land in it). On GPUs,
`calls` more calls follow, outside the profiler, with NVML's NVLink counters read around them
(harness/counters.py; docs/nvlink-counters.md).

A counter launch (the launch carries a CounterPlan: every rank runs under its own Nsight Compute,
harness/launch.py) warms up the same way, then runs one call between cudaProfilerStart and
cudaProfilerStop, the only kernels `ncu` counts, and writes no trace.

Each rank writes into `profile/` of the launch directory:
  r{rank}.trace.json   torch's Chrome trace export of the profiled calls (not in a counter launch)
  r{rank}.info.json    a ProfileInfo (harness/contracts.py): the device-event milliseconds of each
                       call, NVML's NVLink bytes of the counted calls or why there are none
  r{rank}.ncu.csv      a counter launch: what `ncu` printed (its own log file, written by the tool)
The host reads them as untrusted input (pkb_mcp/profiling/traces.py, pkb_mcp/profiling/nvlink.py):
nothing here is a verdict or a credit.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import counters
from harness.contracts import CounterPlan, NvlinkCounts, ProfileInfo, TimingConfig

CALL_LABEL = "pkb.call#"
PROFILE_DIR = "profile"
PROBE_CALLS = 5
NVML_BASELINE_CALLS = 3  # aligned empty calls: what the alignment alone sends over NVLink


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _bus_id(device: Any) -> str:
    import torch

    props = torch.cuda.get_device_properties(device)
    # torch reports the PCI address without declaring it (torch/numa/binding.py reads it the same way)
    address = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    domain, bus, slot = (part if type(part) is int else -1 for part in address)
    if min(domain, bus, slot) < 0:
        raise counters.NvmlError("torch does not report the GPU's PCI address")
    return counters.pci_bus_id(domain, bus, slot)


def nvlink_counts(
    one: Callable[[], Any], empty: Callable[[], Any], settle: Callable[[], Any], device: Any, calls: int
) -> dict[str, Any]:
    """NVML's NVLink bytes over `calls` calls of `one` (each aligned and finished on the device), less
    what `empty` (the alignment alone) sends: {"nvlink": NvlinkCounts}, or {"nvlink_why": reason}.
    `settle()` runs after each call, before the counters are read: every rank done, so that the
    peers' traffic of a call (their reads of this GPU's memory) lands in its own reading."""
    try:
        reader = counters.NvlinkCounters(_bus_id(device))

        def readings(fn: Callable[[], Any], n: int) -> list[tuple[int, int]]:
            settle()
            out = [reader.read()]
            for _ in range(n):
                fn()
                settle()
                out.append(reader.read())
            return out

        base = readings(empty, NVML_BASELINE_CALLS)
        seen = readings(one, calls)
    except counters.NvmlError as exc:
        return {"nvlink_why": str(exc)[:300]}
    base_tx = (base[-1][0] - base[0][0]) // NVML_BASELINE_CALLS
    base_rx = (base[-1][1] - base[0][1]) // NVML_BASELINE_CALLS
    counts: NvlinkCounts = {
        "calls": calls,
        "tx_bytes": max(seen[-1][0] - seen[0][0] - calls * base_tx, 0),
        "rx_bytes": max(seen[-1][1] - seen[0][1] - calls * base_rx, 0),
        "per_call_tx": [b[0] - a[0] for a, b in itertools.pairwise(seen)],
        "per_call_rx": [b[1] - a[1] for a, b in itertools.pairwise(seen)],
        "baseline_tx": base_tx,
        "baseline_rx": base_rx,
    }
    return {"nvlink": counts}


def _warm_up(one: Callable[[], float], timer: Any, device: Any, cfg: TimingConfig) -> int:
    """Warm-up as in harness.timing.run_timing: probe calls, then enough calls to cover warmup_ms,
    sized from the slowest rank; then the alignment sleep from the slowest rank's enqueue time.
    Returns the calls it made."""
    from harness import timing

    probe = [one() for _ in range(PROBE_CALLS)]
    per_call = max(timing.max_over_ranks([statistics.median(probe)], device)[0], 1e-3)
    warmup = int(min(max(float(cfg.get("warmup_ms", 20.0)) / per_call, 3), int(cfg.get("max_warmup", 50))))
    enqueue = []
    for _ in range(warmup):
        one()
        enqueue.append(timer.enqueue_ms)
    slowest = timing.max_over_ranks([statistics.median(enqueue)], device)[0]
    timer.sleep_us = min(max(2e3 * slowest + timing.MIN_SLEEP_US, timer.min_sleep_us), timing.MAX_SLEEP_US)
    return PROBE_CALLS + warmup


def count_one_call(solution: Callable[..., Any], inputs: tuple, device: Any) -> dict[str, Any]:
    """A counter launch's call: the ranks released together, the device idle, then only this call
    between cudaProfilerStart and Stop (what `ncu --profile-from-start off` counts), NVML's counters
    read around it."""
    import torch
    import torch.distributed as dist

    try:
        reader: counters.NvlinkCounters | None = counters.NvlinkCounters(_bus_id(device))
        why = ""
    except counters.NvmlError as exc:
        reader, why = None, str(exc)[:300]
    dist.barrier()
    torch.cuda.synchronize()
    before = reader.read() if reader is not None else (0, 0)
    torch.cuda.profiler.start()
    out = solution(*inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    dist.barrier()  # every rank done: the peers' traffic of the call counts here (a barrier's few bytes too)
    torch.cuda.synchronize()
    after = reader.read() if reader is not None else (0, 0)
    del out
    if reader is None:
        return {"nvlink_why": why}
    tx, rx = after[0] - before[0], after[1] - before[1]
    counts: NvlinkCounts = {
        "calls": 1,
        "tx_bytes": tx,
        "rx_bytes": rx,
        "per_call_tx": [tx],
        "per_call_rx": [rx],
        "baseline_tx": 0,
        "baseline_rx": 0,
    }
    return {"nvlink": counts}


def run(
    solution: Callable[..., Any],
    next_inputs: Callable[[], tuple],
    device: Any,
    cfg: TimingConfig,
    launch_dir: Path,
    rank: int,
    after_call: Callable[[], None],
    plan: CounterPlan | None = None,
) -> None:
    """Warm up, profile `cfg["calls"]` aligned calls, count NVLink bytes over as many more (GPUs),
    write this rank's trace and info files; with a counter `plan`, warm up and run one counted call.

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

    warmed = _warm_up(one, timer, device, cfg)
    out_dir = launch_dir / PROFILE_DIR
    out_dir.mkdir(exist_ok=True)
    info: ProfileInfo = {
        "rank": rank,
        "calls": calls,
        "warmup_calls": warmed + 1,
        "event_ms": [],
        "alignment_sleep_us": timer.sleep_us if device.type == "cuda" else 0.0,
    }
    if plan is not None:
        counted = count_one_call(solution, next_inputs(), device)
        after_call()
        info.update({"calls": 0, "warmup_calls": warmed, "counted": 1, **counted})  # type: ignore[typeddict-item]
        _write_json(out_dir / f"r{rank}.info.json", info)
        return
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
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
                info["event_ms"].append(ms)
            prof.step()
    prof.export_chrome_trace(str(out_dir / f"r{rank}.trace.json"))
    if device.type == "cuda":
        import torch

        def settle() -> None:
            timing.max_over_ranks([0.0], device)
            torch.cuda.synchronize()

        counts = nvlink_counts(one, lambda: timer.time(lambda: None), settle, device, calls)
        info.update(counts)  # type: ignore[typeddict-item]
    else:
        info["nvlink_why"] = "the launch ran on CPU"
    _write_json(out_dir / f"r{rank}.info.json", info)
