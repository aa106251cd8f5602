"""Judging on the host: each rank's outputs against the reference's, the verdict and its root
cause, a benchmark's timing record refused, and the guards on a measured time (the physical floor,
memoized outputs)."""

from __future__ import annotations

from harness import tensorfile
from pkb_mcp import problems
from pkb_mcp.compile import failures
from pkb_mcp.errors import UserError
from pkb_mcp.launches import LaunchOutcome
from pkb_mcp.models import RankResult, RooflineResult, TimingStats
from pkb_mcp.runs import judge, stats
from pkb_mcp.runs.run import rank_result

RANK_STATE_ORDER = ["pass", "wrong", "exited", "aborted", "error", "crashed", "timeout"]
# A median below this fraction of the roofline's bandwidth/compute floor is physically impossible
# (the slack covers traffic models that round up and ceilings a kernel can beat a little).
FLOOR_SLACK = 0.8


def judge_ranks(
    p: problems.Problem,
    world_size: int,
    keys: list[int],
    cand: LaunchOutcome,
    ref: LaunchOutcome,
    mac_key: bytes | None = None,
    fresh: bool = False,
    sources: failures.SolutionSources | None = None,
) -> list[RankResult]:
    """Each rank's worst outcome over the trials (or timed input sets; with `fresh`, the timed calls
    on fresh input sets), in rank order.

    With `mac_key` (derived from the launch's secret seeds), every candidate output file must carry the
    keyed digest the harness wrote into it: a file rewritten after the harness wrote it is rejected.
    `sources` maps a failed build's errors to the solution's lines (run.Run.sources).
    """
    wants = ref.fresh_outputs if fresh else ref.outputs
    gots = cand.fresh_outputs if fresh else cand.outputs
    errors = cand.fresh_output_errors if fresh else cand.output_errors
    results = []
    for rank in range(world_size):
        rank_outcome = cand.ranks[rank]
        if rank_outcome.state != "ok":
            results.append(rank_result(rank_outcome, sources))
            continue
        worst: RankResult | None = None
        for key in keys:
            want = wants.get((key, rank))
            got = gots.get((key, rank))
            if want is None:
                unread = (ref.fresh_output_errors if fresh else ref.output_errors).get((key, rank))
                raise UserError(
                    f"the reference of problem {p.id} left no output for rank {rank}; "
                    + (
                        f"its file could not be read: {unread}"
                        if unread
                        else "the launch directory may be full"
                    )
                )
            if got is None:
                err = errors.get((key, rank), "no output file")
                # a header that describes other outputs than the reference's: wrong, in the judge's words
                message = (
                    judge.header_mismatch(err)
                    if isinstance(err, tensorfile.Mismatch)
                    else f"unreadable output: {err}"
                )
                res = RankResult(rank=rank, trial=key, state="wrong", message=message)
            elif mac_key is not None and not tensorfile.verify(mac_key, got.structure, got.tensors, got.meta):
                res = RankResult(
                    rank=rank,
                    trial=key,
                    state="wrong",
                    message="its output file was altered after the harness wrote it (a forged result "
                    "file); results are written by the harness only",
                )
            else:
                res = judge.compare(rank, key, got, want, p.bounds)
            if worst is None or RANK_STATE_ORDER.index(res.state) > RANK_STATE_ORDER.index(worst.state):
                worst = res
            if res.state != "pass":
                break
        assert worst is not None
        if worst.state == "pass":
            worst.trial = None
        worst.log_tail = rank_outcome.log_tail[-2000:] or None  # what the rank printed (capped)
        results.append(worst)
    return results


# What gloo and NCCL say on a rank whose peer died: the failure is a consequence, not a cause.
PEER_LOSS = ("closed by peer", "reset by peer", "remote worker", "communicator was aborted", "Broken pipe")


def lost_a_peer(r: RankResult) -> bool:
    return r.state == "aborted" or (r.state == "error" and any(m in r.message for m in PEER_LOSS))


def failed_to_build(ranks: list[RankResult]) -> bool:
    """Whether a rank failed because an extension of the solution failed to build (not because the
    solution raised, or because a build failed that it never loaded)."""
    return any(r.state == "error" and r.message.startswith(failures.BUILD_FAILED) for r in ranks)


def decide(ranks: list[RankResult]) -> tuple[str, str]:
    failed = [r for r in ranks if r.state != "pass"]
    if not failed:
        return "pass", ""
    verdict = "timeout" if any(r.state == "timeout" for r in failed) else "fail"
    # the root cause: a rank that failed on its own, before one that only lost a peer; then the earliest
    lead = min(failed, key=lambda r: (lost_a_peer(r), r.ended_s if r.ended_s is not None else 1e9))
    where = f"rank {lead.rank}" + (f", trial {lead.trial}" if lead.trial is not None else "")
    return verdict, f"{where}: {lead.message}"


def refused_timing(
    ranks: list[RankResult], cand: LaunchOutcome, mac_key: bytes
) -> tuple[str, str, str | None] | None:
    """(verdict, why, protection) when a candidate's benchmark launch gives no time to use: wrong
    outputs, no timing record, a forged one, timed outputs that changed, or inputs it changed; else
    None. `protection` names the one of pkb's (runs/protections.py) that refused outputs judged right
    (timed outputs that changed, inputs changed while timed); None for any other refusal."""
    verdict, why = decide(ranks)
    if verdict != "pass":
        return verdict, why, None
    record = cand.timing
    if record is None:  # no file, or one that is not a JSON object: something other than the harness wrote it
        return (
            "fail",
            "the candidate's launch left no readable timing record (missing, or rewritten after the "
            "harness wrote it); no time of this run is used",
            None,
        )
    if not tensorfile.verify_record(mac_key, record):
        return (
            "fail",
            "the timing record was altered after the harness wrote it (a forged result file); "
            "no time of this run is used",
            None,
        )
    if record.get("timed_output_mismatches"):
        first = record["timed_output_mismatches"][0]
        rotated = (
            " (between rounds the harness moves other data into the same input buffers: a result "
            "cached by buffer address goes stale)"
            if record.get("rotated_inputs")
            else ""
        )
        return (
            "fail",
            f"a timed call's output (call {first}) differs from the judged output of "
            f"the same inputs; results must be right on every call{rotated}",
            "timed_outputs",
        )
    if record.get("inputs_mutated_while_timing"):
        return "fail", "the solution changed its inputs while being timed; inputs are read-only", "mutation"
    return None


def physical_floor_ms(roof: RooflineResult) -> float:
    """The part of the floor that physics guarantees: bytes over the link and HBM, FLOPs at peak.
    (The latency term is an assumed cost per round, not a bound, so the guard leaves it out.)"""
    return max(roof.nvlink_ms, roof.hbm_ms, roof.compute_ms)


def below_floor(time_ms: float, roof: RooflineResult, slack: float = FLOOR_SLACK) -> bool:
    """Whether a measured time is below what the hardware can do: the speed-of-light guard."""
    return time_ms < slack * physical_floor_ms(roof)


def floor_message(time_ms: float, roof: RooflineResult, speed: float) -> str:
    terms = {"NVLink": roof.nvlink_ms, "HBM": roof.hbm_ms, "compute": roof.compute_ms}
    bound = max(terms, key=lambda k: terms[k])
    return (
        f"not credited: the candidate's median {time_ms:.4g} ms is below the physical floor "
        f"{terms[bound]:.4g} ms (its {bound} traffic at the ceilings of {roof.ceilings.source}); work "
        f"was skipped or hidden from the clock, or the traffic model is wrong (measured {speed:.3f}x "
        "the reference)"
    )


def seen_inputs_message(ref: TimingStats, cand: TimingStats, speed: float, fresh_speed: float | None) -> str:
    """Why a candidate much faster on inputs it has seen is not credited, with the figures."""
    assert cand.replay_advantage is not None and cand.fresh_median_ms is not None
    relative = stats.seen_inputs_advantage(ref, cand)
    on_fresh = f"; on fresh inputs it measured {fresh_speed:.3f}x" if fresh_speed else ""
    return (
        f"not credited: the candidate is {relative:.2f}x faster on input sets it has seen than on fresh "
        f"ones (fresh calls: median {cand.fresh_median_ms:.4g} ms over {cand.fresh_calls}, each "
        f"{cand.replay_advantage:.2f}x its replayed neighbours at the median, sign test p = "
        f"{cand.replay_advantage_p:.2g}): outputs memoized by input values? (measured {speed:.3f}x the "
        f"reference{on_fresh})"
    )
