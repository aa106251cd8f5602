"""The benchmark: both sides timed the same way on the same inputs in sandboxed launches, every timed
output re-checked, the speedup credited only where the guards allow (docs/measurement.md)."""

from __future__ import annotations

import secrets
import threading
from typing import Any, cast

from harness import tensorfile
from harness.contracts import TimingConfig, TimingRecord
from pkb_mcp import render, roofline
from pkb_mcp.launches import LaunchOutcome, run_launch, timing_window, warm_pool
from pkb_mcp.models import BenchResult, RunRequest, TimingStats
from pkb_mcp.runs import conventions, judge, protections, stats
from pkb_mcp.runs.context import DIRECT, JobContext, Progress
from pkb_mcp.runs.run import Run, reference_failed
from pkb_mcp.runs.verdicts import (
    below_floor,
    decide,
    floor_message,
    judge_ranks,
    refused_timing,
    seen_inputs_message,
)

# How each side of a benchmark is sampled (harness/timing.py). On GPUs the L2 is also flushed before
# every timed call (its size is read from the device), so a handful of distinct input sets is enough
# (each one is judged on the host).
GPU_TIMING: TimingConfig = {
    "warmup_ms": 200.0,
    "max_warmup": 2000,
    "min_samples": 30,
    "max_samples": 3000,
    "budget_ms": 2000.0,
    "min_span_ms": 500.0,
    "precision": 0.005,
    "max_sets": 8,
    "rotation_bytes": 8 << 30,
    # timed calls on fresh input sets (docs/measurement.md): at least fresh_min before precision may
    # stop a launch, at most fresh_max, and no more than fit in fresh_bytes of outputs per rank
    "fresh_min": 8,
    "fresh_max": 24,
    "fresh_bytes": 1 << 30,
}
CPU_TIMING: TimingConfig = {
    "warmup_ms": 20.0,
    "max_warmup": 50,
    "min_samples": 10,
    "max_samples": 200,
    "budget_ms": 500.0,
    "min_span_ms": 0.0,
    "precision": 0.01,
    "l2_bytes": 32 << 20,
    "max_sets": 4,
    "rotation_bytes": 1 << 30,
    "fresh_min": 8,
    "fresh_max": 16,
    "fresh_bytes": 128 << 20,
}


def timing_config(device: str) -> TimingConfig:
    """How long and how much to sample on this device (a fresh copy)."""
    if device == "cuda":
        import torch

        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))
        return TimingConfig(**GPU_TIMING, l2_bytes=l2)
    return CPU_TIMING.copy()


# The parts of a timing configuration that a side's launches share out between them.
_SHARED_MS = ("warmup_ms", "budget_ms", "min_span_ms")


def launch_share(cfg: TimingConfig, launches: int) -> TimingConfig:
    """The configuration of one of a side's `launches`: its share of the warm-up, budget, minimum
    span, sample cap (never fewer samples than `min_samples`) and fresh calls it must make before
    precision may stop it (never fewer than 2)."""
    shared: dict[str, Any] = dict(cfg)
    if launches > 1:
        for key in _SHARED_MS:
            if key in shared:
                shared[key] = float(shared[key]) / launches
        shared["max_samples"] = max(int(cfg["max_samples"]) // launches, int(cfg["min_samples"]))
        shared["max_warmup"] = max(int(cfg["max_warmup"]) // launches, 3)
        if "fresh_min" in cfg:
            shared["fresh_min"] = max(int(cfg["fresh_min"]) // launches, 2)
    return cast(TimingConfig, shared)


def bench(request: RunRequest, job: JobContext = DIRECT) -> BenchResult:
    """Time the reference and the candidate the same way on the same inputs; re-check every timed output.

    `request.launches` > 1 times each side in that many separate launches, reference and candidate
    alternating, which share the side's sampling budget: identical code spreads more between
    launches than within one, and the median of several launches' medians spreads less. The default
    (one a side) is the measured method of docs/gpu-results.md."""
    progress, cancel = job.progress, job.cancel
    launches = request.launches
    run = Run(request)

    def result(verdict: str, message: str, **fields: Any) -> BenchResult:
        return BenchResult(verdict=verdict, message=message, **run.result_fields(), **fields)

    if (cannot := run.cannot_run()) is not None:
        return result("fail", cannot[0], ranks=cannot[1])
    run.prepare_extensions(progress, cancel)
    seeds = [secrets.randbits(62)]
    tcfg = launch_share(timing_config(run.device), launches)  # a side's launches share its budget
    ran, ref_records = _time_sides(run, seeds, tcfg, launches, progress, cancel)
    job.release_gpus()  # what is left is judging, on the host: the GPUs may go to the next job
    run.notes += conventions.notes(ran[0][1])
    ref_stats, ref_warnings = stats.summarize(stats.pool_launches(ref_records))
    run.warnings.extend(f"reference: {w}" for w in ref_warnings)
    fields: dict[str, Any] = {"reference": ref_stats}
    refused, cand_records = _judge_launches(
        run, ran, ref_records, launches, tensorfile.result_key(seeds), fields
    )
    if refused is not None:
        return result(*refused, **fields)
    cand_stats, warnings = stats.summarize(stats.pool_launches(cand_records))
    run.warnings.extend(warnings)
    verdict, message = _credit(run, ref_stats, cand_stats, launches, fields)
    done = result(verdict, message, candidate=cand_stats, **fields)
    steps = 2 * launches + 1
    progress(steps, steps, render.bench_headline(done))  # the job's message: as the result leads
    return done


def _launch_of(launch: int, launches: int) -> str:
    return f" (launch {launch + 1} of {launches})" if launches > 1 else ""


def _time_sides(
    run: Run,
    seeds: list[int],
    tcfg: TimingConfig,
    launches: int,
    progress: Progress,
    cancel: threading.Event | None,
) -> tuple[list[tuple[LaunchOutcome, LaunchOutcome]], list[TimingRecord]]:
    """Each launch's reference, then its candidate, until a candidate launch fails: the (reference,
    candidate) outcomes in order, and the reference's timing records."""
    p = run.problem
    steps = 2 * launches + 1
    pool = warm_pool(run.backend)
    ran: list[tuple[LaunchOutcome, LaunchOutcome]] = []
    ref_records: list[TimingRecord] = []

    def launch_timing(launch: int, reference: bool) -> TimingConfig:
        # each launch's fresh input sets are its own; the reference's launch makes outputs for all of them
        return TimingConfig(**tcfg, fresh_label=f"launch{launch}", fresh_top_up=reference)

    ref_request = run.launch_request("benchmark", p.path, seeds, launch_timing(0, True))
    # every launch gets a sandbox started ahead: none may start while the other side is timed
    ahead = (
        f"starting a sandbox for each of the {2 * launches} launches, then "
        if pool is not None and launches > 1
        else ""
    )
    progress(0, steps, f"{ahead}timing the reference{_launch_of(0, launches)}")
    # no sandbox warms up on the GPUs while any launch is timed (this waits for those warming up)
    with timing_window(ref_request, run.backend, 2 * launches):
        for launch in range(launches):
            if launch:
                progress(2 * launch, steps, f"timing the reference{_launch_of(launch, launches)}")
            ref_outcome = run_launch(
                run.launch_request("benchmark", p.path, seeds, launch_timing(launch, True)),
                run.backend,
                cancel,
            )
            if not ref_outcome.ok or ref_outcome.timing is None:
                raise reference_failed(p, ref_outcome, run.timeout_s)
            ref_records.append(ref_outcome.timing)
            so_far = stats.summarize(stats.pool_launches(ref_records))[0].median_ms
            progress(
                2 * launch + 1,
                steps,
                f"reference: {so_far:.4g} ms; timing the candidate{_launch_of(launch, launches)}",
            )
            cand_request = run.launch_request("benchmark", run.solution, seeds, launch_timing(launch, False))
            # its files must hold what the reference's launch of the same inputs left, read no further
            cand_request = judge.expecting(cand_request, ref_outcome)
            # the last one may end before its sandbox: nothing is timed after it here
            cand_request.ends_early = launch == launches - 1
            cand_outcome = run_launch(cand_request, run.backend, cancel)
            ran.append((ref_outcome, cand_outcome))
            if not cand_outcome.ok:
                break  # judged next: the first failure decides
    return ran, ref_records


def _judge_launches(
    run: Run,
    ran: list[tuple[LaunchOutcome, LaunchOutcome]],
    ref_records: list[TimingRecord],
    launches: int,
    mac_key: bytes,
    fields: dict[str, Any],
) -> tuple[tuple[str, str] | None, list[TimingRecord]]:
    """Every candidate launch's outputs judged (the replayed sets, then the timed fresh calls), its
    timing record checked: (verdict, message) of the first that fails, or None and the candidate's
    records. Sets `fields["ranks"]`."""
    p, world_size = run.problem, run.world_size
    cand_records: list[TimingRecord] = []
    for launch, (ref_outcome, cand_outcome) in enumerate(ran):
        sets = int(ref_records[launch]["input_sets"])
        keys = list(range(sets))
        fields["ranks"] = judge_ranks(
            p, world_size, keys, cand_outcome, ref_outcome, mac_key, sources=run.sources
        )
        refused = refused_timing(fields["ranks"], cand_outcome, mac_key)
        if refused is not None:
            verdict, why, protection = refused
            found = protections.timed_calls(p, protection, why) or protections.judged_outputs(
                p, keys, cand_outcome, ref_outcome, fields["ranks"], mac_key
            )
            where = _launch_of(launch, launches)
            return _refusal(verdict, why + where, found, where, fields), cand_records
        assert cand_outcome.timing is not None
        # every timed call on a fresh input set is judged too: right on the replayed sets is not enough
        timed = int(cand_outcome.timing.get("fresh_timed", 0))
        fresh_keys = [int(k) for k in cand_outcome.timing.get("fresh_judged", []) if int(k) < timed]
        if not fresh_keys:  # sampling stopped before any fresh call whose outputs are kept was timed
            judged = (
                f"no timed call on a fresh input set had its outputs judged{_launch_of(launch, launches)}"
            )
            run.warnings.append(f"{judged} ({timed} timed)")
            cand_records.append(cand_outcome.timing)
            continue
        fresh_ranks = judge_ranks(
            p, world_size, fresh_keys, cand_outcome, ref_outcome, mac_key, fresh=True, sources=run.sources
        )
        verdict, why = decide(fresh_ranks)
        if verdict != "pass":
            fields["ranks"] = fresh_ranks
            why = (
                f"wrong on a fresh input set (a timed call on inputs never seen before; the trial number "
                f"is the fresh call's){_launch_of(launch, launches)}: {why}"
            )
            found = protections.fresh_outputs(p, fresh_ranks, cand_outcome, mac_key)
            return _refusal(verdict, why, found, _launch_of(launch, launches), fields), cand_records
        cand_records.append(cand_outcome.timing)
    return None, cand_records


def _refusal(
    verdict: str, why: str, found: list[protections.Breach] | None, where: str, fields: dict[str, Any]
) -> tuple[str, str]:
    """A refused benchmark's verdict and message (`why`); where the candidate is correct by the
    original benchmark's rules (runs/protections.py), the message says so instead, naming the
    protections (and the launch, `where`), and so does `fields`."""
    if not found:
        return verdict, why
    fields["protections"] = protections.names(found)
    return verdict, protections.message(found) + where


def _credit(
    run: Run,
    ref_stats: TimingStats,
    cand_stats: TimingStats,
    launches: int,
    fields: dict[str, Any],
) -> tuple[str, str]:
    """The verdict and the message of timings that passed judging: the speedup with its range (led
    by "within noise" where identical code could have given it), the roofline, and the guards (the
    physical floor, memoized outputs). Sets the result's remaining fields in `fields`."""
    p = run.problem
    speed, low, high = stats.speedup(ref_stats, cand_stats)
    fields.update(speedup=speed, speedup_low=low, speedup_high=high)
    time_ms = cand_stats.median_ms if run.device == "cuda" else None
    roof = roofline.floor(
        p.id, p.name, run.world_size, run.size, p.traffic(run.world_size, run.size), p.dtype, time_ms
    )
    if cand_stats.fresh_median_ms and ref_stats.fresh_median_ms:
        fields["fresh_speedup"] = ref_stats.fresh_median_ms / cand_stats.fresh_median_ms
    fresh = fields.get("fresh_speedup")
    fields["within_noise"] = stats.within_noise(speed, run.device, fresh, (low, high))
    verdict = "pass"
    message = (
        f"{render.speedup_words(speed, low, high, fields['within_noise'])}; candidate "
        f"{cand_stats.median_ms:.4g} ms, reference {ref_stats.median_ms:.4g} ms"
    )
    if launches > 1:
        spreads = [s.launch_spread or 0.0 for s in (cand_stats, ref_stats)]
        message += (
            f"; {launches} launches per side, their medians spread {spreads[0]:.1%} (candidate) and "
            f"{spreads[1]:.1%} (reference)"
        )
    fields["seen_inputs_advantage"] = stats.seen_inputs_advantage(ref_stats, cand_stats)
    limit = stats.REPLAY_ADVANTAGE_LIMIT.get(run.device, stats.REPLAY_ADVANTAGE_LIMIT["cpu"])
    if (ref_stats.replay_advantage or 0.0) > limit:
        run.warnings.append(
            f"the reference itself is {ref_stats.replay_advantage:.2f}x faster on replayed input sets "
            "than on fresh ones: the check for memoized outputs is weaker on this problem here"
        )
    noise = (
        "; no evidence of a difference: identical code lands up to "
        f"{stats.run_to_run_spread(run.device):.0%} either way between runs on {run.device.upper()}"
    )
    if stats.sides_disagree(speed, fresh):
        noise += ", and the fresh calls' speedup is on the other side of 1.00x"
    if stats.range_includes_one(run.device, (low, high)):
        noise += ", and the quartile range includes 1.00x"
    if run.device != "cuda":
        roof.note = "timed on CPU: the floor is for GPU ceilings, so no % of floor is given"
        if fields["within_noise"]:
            message += noise
    else:
        if below_floor(cand_stats.median_ms, roof):
            verdict = "suspect"
            fields["below_floor"] = True
            message = floor_message(cand_stats.median_ms, roof, speed)
        else:
            if fields["within_noise"]:
                message += noise
            if roof.note:
                run.warnings.append(
                    f"candidate time {cand_stats.median_ms:.4g} ms is below the floor "
                    f"{roof.floor_ms:.4g} ms: the measurement is suspect"
                )
    if stats.faster_on_seen_inputs(ref_stats, cand_stats, run.device):
        verdict = "suspect"
        fields["faster_on_seen_inputs"] = True
        message = seen_inputs_message(ref_stats, cand_stats, speed, fields.get("fresh_speedup"))
    fields["roofline"] = roof.placement()
    return verdict, message
