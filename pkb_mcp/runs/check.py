"""The correctness check: the candidate and the reference on every rank over fresh secret-seeded
trials, every output judged on the host (pkb_mcp/runs/verdicts.py), then, after a pass, one trial at a
size the candidate was never shown (pkb_mcp/runs/unseen.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from harness import tensorfile
from pkb_mcp.models import CheckResult, RankResult, RunRequest
from pkb_mcp.runs import conventions, protections, references, static_report, unseen
from pkb_mcp.runs.context import DIRECT, JobContext, Progress
from pkb_mcp.runs.run import Run, reference_failed
from pkb_mcp.runs.verdicts import decide, judge_ranks


def check(request: RunRequest, job: JobContext = DIRECT) -> CheckResult:
    """Run the candidate on every rank over fresh secret-seeded trials and judge every output."""
    run = Run(request)
    trials = request.trials
    progress, cancel = job.progress, job.cancel

    def result(
        verdict: str,
        message: str,
        ranks: list[RankResult],
        named: list[str] | None = None,
        found: unseen.Generalization = unseen.NOT_JUDGED,
    ) -> CheckResult:
        return CheckResult(
            verdict=verdict,
            message=message,
            ranks=ranks,
            trials=trials,
            protections=named or [],
            generalizes=found.generalizes,
            unseen=found.unseen,
            **run.result_fields(),
        )

    if (cannot := run.cannot_run()) is not None:
        return result("fail", *cannot)
    run.prepare_extensions(progress, cancel)
    trial = unseen.Trial(run, cancel) if request.unseen else None
    try:
        return _judged_check(run, trials, trial, progress, cancel, result)
    finally:
        if trial is not None:  # nothing of the check outlives it
            trial.discard()


def _judged_check(
    run: Run,
    trials: int,
    trial: unseen.Trial | None,
    progress: Progress,
    cancel: threading.Event | None,
    result: Callable[..., CheckResult],
) -> CheckResult:
    """The judged trials, then the unseen-size trial's result where they pass (started beside them
    where it may be: `unseen.Trial`)."""
    p, world_size = run.problem, run.world_size
    steps = 4 if trial is not None else 3
    beside = trial is not None and trial.side_by_side
    progress(
        0,
        steps,
        f"running reference and candidate: {trials} trials on {world_size} ranks ({run.device})"
        + (", and one trial at a size never shown" if beside else ""),
    )
    seeds, ref_outcome, cand_outcome = references.judged_launches(run, trials, trial, cancel)
    if not ref_outcome.ok or cand_outcome is None:
        raise reference_failed(p, ref_outcome, run.timeout_s)
    run.notes += conventions.notes(cand_outcome)
    progress(2, steps, "judging outputs")
    mac_key = tensorfile.result_key(seeds)
    ranks = judge_ranks(
        p, world_size, list(range(trials)), cand_outcome, ref_outcome, mac_key, sources=run.sources
    )
    verdict, why = decide(ranks)
    in_trials = f"{trials} trial" + ("s" if trials != 1 else "")
    message = f"all {world_size} ranks match the reference in {in_trials}" if verdict == "pass" else why
    raised_on_cpu = run.device == "cpu" and all(r.state in ("pass", "error") for r in ranks)
    if verdict != "pass" and raised_on_cpu and (uses := static_report.gpu_only(run.sources.text)):
        message = f"needs CUDA GPUs (it uses {', '.join(uses)}); on CPU {why}"
    # correct by the original benchmark's rules, failed by pkb's protections: named (original variant)
    found = protections.judged_outputs(p, list(range(trials)), cand_outcome, ref_outcome, ranks, mac_key)
    if found:
        message = protections.message(found)
    generalization = unseen.NOT_JUDGED
    if verdict == "pass" and trial is not None:
        doing = "judging" if beside else "running"
        progress(3, steps, f"judged: pass; {doing} one trial at a size it was never shown")
        generalization = trial.judge()
        progress(steps, steps, f"judged: pass; generalizes: {generalization.generalizes or 'not judged'}")
    else:  # the message itself is the result's headline, said once
        progress(steps, steps, f"judged: {verdict}")
    return result(verdict, message, ranks, protections.names(found) if found else [], generalization)
