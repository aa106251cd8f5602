"""A check's reference launch, and reference outcomes made ahead for the checks a batch expects.

A check runs the reference beside the candidate, in a launch of its own: the judged trials, and,
where the unseen-size trial runs beside them at the run's world size, that trial's reference part
after them (runs/unseen.py `Trial.later`). On GPUs every launch takes a sandbox whose GPU step no
benchmark may time beside (docs/gpu-results.md, "What a file's GPU time is made of"), so in a batch
of many files of one problem those launches add up. Where a batch expects more checks of a problem
(`Stock.expecting`), a check's reference launch also runs the next checks' reference trials, for
seeds the host draws now, and keeps their outcomes (`Prepared`); a later check of the same shape
takes one instead of launching its reference.

Each prepared outcome is taken once. Its seeds were drawn on the host as a check's own are, sent
only on the reference's stdin (its launch directory is the reference's, never a candidate's), and
the candidate that takes it is the first to see its inputs: what a memoizing candidate could learn
is what it could before. At most AHEAD are kept a shape, none whose outputs exceed MAX_BYTES; what is
left when the batch ends is dropped.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import NamedTuple

from harness.contracts import LaterTrials
from pkb_mcp.launches import LaunchOutcome
from pkb_mcp.log import get
from pkb_mcp.runs import judge, unseen
from pkb_mcp.runs.run import Run

log = get(__name__)

AHEAD = 4  # checks a reference launch prepares for at most, beyond its own
MAX_BYTES = 256 << 20  # a prepared check's reference outputs kept at most (host memory)


class Shape(NamedTuple):
    """What a prepared reference must match (shape_of): its problem's file, and the rest of the run's
    shape as JSON."""

    problem_file: str
    rest: str


class AheadTrial(NamedTuple):
    """A prepared check's unseen-size trial: where it runs, its seeds, its reference's outcome."""

    placed: unseen.Placement
    seeds: list[int]
    reference: LaunchOutcome


@dataclass
class Prepared:
    """A later check's reference, run ahead: its judged trials' seeds and outcome, and its unseen-size
    trial where one was drawn at the run's world size (where it runs and its seed, and its
    reference's outcome: unseen.Trial.adopt)."""

    seeds: list[int]
    reference: LaunchOutcome
    trial: AheadTrial | None = None


class Stock:
    """Prepared references by shape (the reference launch's settings but its seeds), while a batch
    expects checks of their problems."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[str, int] = {}  # checks still to come, by problem file
        self._held: dict[Shape, list[Prepared]] = {}
        self._too_large: set[Shape] = set()  # shapes whose outputs are not held: none prepared again

    @contextmanager
    def expecting(self, counts: dict[str, int]) -> Iterator[None]:
        """While the block runs, `counts[problem file]` checks of each problem are expected; what is
        prepared and not taken is dropped at its end."""
        with self._lock:
            for path, n in counts.items():
                self._expected[path] = self._expected.get(path, 0) + n
        try:
            yield
        finally:
            with self._lock:
                for path, n in counts.items():
                    self._expected[path] = max(0, self._expected.get(path, 0) - n)
                    if not self._expected[path]:
                        del self._expected[path]
                self._held = {k: v for k, v in self._held.items() if k[0] in self._expected}
                self._too_large = {k for k in self._too_large if k[0] in self._expected}

    def take(self, shape: Shape) -> Prepared | None:
        """A prepared reference of this shape, taken for good; counts one expected check as come."""
        with self._lock:
            path = shape[0]
            if self._expected.get(path, 0) > 0:
                self._expected[path] -= 1
            held = self._held.get(shape)
            return held.pop(0) if held else None

    def wanted(self, shape: Shape) -> int:
        """How many more checks of this shape a reference launch should prepare for now."""
        with self._lock:
            if shape in self._too_large:
                return 0
            expected = self._expected.get(shape[0], 0)
            return max(0, min(AHEAD, expected) - len(self._held.get(shape, ())))

    def put(self, shape: Shape, prepared: list[Prepared]) -> None:
        """Keep these for later checks of the shape, unless their outputs are too large to hold (then
        none of the shape is prepared again)."""
        if not prepared:
            return
        with self._lock:
            if max(_bytes(p) for p in prepared) > MAX_BYTES:
                self._too_large.add(shape)
            elif self._expected.get(shape[0], 0) > 0:
                self._held.setdefault(shape, []).extend(prepared)


STOCK = Stock()


def shape_of(run: Run, trials: int, with_trial: bool) -> Shape:
    """What a prepared reference must match: the problem file; the GPUs, the reference launch's
    settings but its seeds, the number of trials, whether the check runs an unseen-size trial, and
    the sandbox backend."""
    request = run.launch_request("outputs", run.problem.path, [])
    settings = {k: v for k, v in request.settings.items() if k not in ("seeds", "later")}
    rest = [request.gpus, settings, trials, with_trial, run.backend.name]
    return Shape(str(request.problem_path), json.dumps(rest, sort_keys=True))


def _bytes(p: Prepared) -> int:
    outcomes = [p.reference, *([p.trial.reference] if p.trial is not None else [])]
    return sum(t.nbytes for o in outcomes for out in o.outputs.values() for t in out.tensors)


def judged_launches(
    run: Run, trials: int, trial: unseen.Trial | None, cancel: threading.Event | None, stock: Stock = STOCK
) -> tuple[list[int], LaunchOutcome, LaunchOutcome | None]:
    """The judged trials' seeds and the reference's and the candidate's outcomes (the candidate's None
    where the reference failed first, without isolation). The reference's comes from `stock` where
    one was prepared (the trial then takes its own part from it), else from a launch beside the
    candidate's that also runs the trial's reference part and prepares the checks `stock` wants."""
    p = run.problem
    shape = shape_of(run, trials, trial is not None)
    ready = stock.take(shape)
    log.info("references.take", problem=p.id, made_ahead=ready is not None)
    if ready is not None:
        if trial is not None:
            if ready.trial is not None:
                trial.adopt(*ready.trial)
            trial.start(shared=False)
        return (
            ready.seeds,
            ready.reference,
            run.run_one(
                judge.expecting(run.launch_request("outputs", run.solution, ready.seeds), ready.reference),
                cancel,
            ),
        )
    seeds = [secrets.randbits(62) for _ in range(trials)]
    own = trial.later if trial is not None else None
    ahead = [
        ([secrets.randbits(62) for _ in range(trials)], unseen.Trial(run) if trial is not None else None)
        for _ in range(stock.wanted(shape) if run.backend.isolated else 0)
    ]
    later: list[LaterTrials] = [own] if own is not None else []
    shown = p.size(run.size)
    for ahead_seeds, ahead_trial in ahead:
        later.append({"size": shown, "seeds": ahead_seeds})
        if ahead_trial is not None and ahead_trial.later is not None:
            later.append(ahead_trial.later)
    if trial is not None:
        trial.start()
    ref_outcome, cand_outcome = run.launch_pair(
        run.launch_request("outputs", p.path, seeds, later=later or None),
        run.launch_request("outputs", run.solution, seeds),
        cancel,
    )
    if not later:
        return seeds, ref_outcome, cand_outcome
    if not ref_outcome.ok:  # told apart from the later parts: the judged trials' reference alone
        if trial is not None:
            trial.reference_lost()
        return seeds, run.run_one(run.launch_request("outputs", p.path, seeds), cancel), cand_outcome
    parts = split_outcome(ref_outcome, [trials, *(len(group["seeds"]) for group in later)])
    ref_outcome, rest = parts[0], iter(parts[1:])
    if trial is not None and own is not None:
        trial.take_reference(next(rest))
    prepared = []
    for ahead_seeds, ahead_trial in ahead:
        entry = Prepared(ahead_seeds, next(rest))
        if ahead_trial is not None and ahead_trial.later is not None:
            assert ahead_trial.placed is not None
            entry.trial = AheadTrial(ahead_trial.placed, ahead_trial.seeds, next(rest))
        prepared.append(entry)
    if prepared:
        stock.put(shape, prepared)
        trials_run = sum(len(group["seeds"]) for group in later)
        log.info("references.ahead", problem=p.id, checks=len(prepared), later_trials=trials_run)
    return seeds, ref_outcome, cand_outcome


def split_outcome(outcome: LaunchOutcome, counts: list[int]) -> list[LaunchOutcome]:
    """A launch that ran its trials and then later ones (harness/contracts.py LaterTrials), as one
    outcome for each group of `counts` trials in turn, each numbered from 0."""
    parts = []
    low = 0
    for count in counts:
        high = low + count
        parts.append(
            replace(
                outcome,
                outputs={(t - low, r): v for (t, r), v in outcome.outputs.items() if low <= t < high},
                output_errors={
                    (t - low, r): v for (t, r), v in outcome.output_errors.items() if low <= t < high
                },
            )
        )
        low = high
    return parts
