"""The unseen-size check: every check also judges the candidate on a size it was never shown.

An agent reads a problem's size presets (`pkb show`) and can write a kernel that works only there: a
shape test that skips the exchange elsewhere passes every judged trial. So each problem declares the
sizes it also runs at, `unseen_size(draw, world_size)` (docs/problem-format.md), and each check
draws one of them per request, a value no preset uses for each key the hook draws, within the
problem's rules (its `check_world_size`). Where the run has more than two ranks, the trial also moves
to a smaller world size the problem allows (W = 4 runs it at 3, else 2: a kernel written for one W
fails), within the GPUs the run holds.

The candidate runs one trial there in a launch of its own (`Trial`): beside the judged trials' in
isolated sandboxes at the `pkb` size, else after them. Beside them at the run's own world size, the
reference's part runs in the judged trials' reference launch, after its trials (one sandbox less a
check); elsewhere in a launch of its own beside the candidate's.
Nothing at the unseen size changes the verdict, and only a check that passed reads it. The result
says apart whether the candidate `generalizes`. The original variant judges the original's shapes
only, as the original benchmark does: it has no unseen sizes.
"""

from __future__ import annotations

import random
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from harness import tensorfile
from harness.contracts import LaterTrials
from pkb_mcp import config, problems
from pkb_mcp.launches import LaunchOutcome
from pkb_mcp.models import UnseenResult
from pkb_mcp.runs import judge
from pkb_mcp.runs.run import Run
from pkb_mcp.runs.verdicts import decide, judge_ranks

DRAWS = 32  # sizes drawn until one satisfies the problem's rules
HOOK = "unseen_size"


class Draw:
    """What a problem's `unseen_size` hook draws with: `draw(key, low, high, multiple)` is an integer
    in [low, high], a multiple of `multiple`, that no preset of the problem gives `key`."""

    def __init__(self, presets: list[dict[str, Any]], rng: random.Random) -> None:
        self.presets = presets
        self.rng = rng

    def __call__(self, key: str, low: int, high: int, multiple: int = 1) -> int:
        if multiple < 1 or low > high:
            raise ValueError(f"unseen_size: no range for {key!r}: [{low}, {high}] in steps of {multiple}")
        first = -(-low // multiple) * multiple
        count = (high - first) // multiple + 1 if first <= high else 0
        shown = {p[key] for p in self.presets if key in p}
        if count <= len(shown) and all(first + i * multiple in shown for i in range(count)):
            raise ValueError(f"unseen_size: every value of {key!r} in [{low}, {high}] is a preset's")
        while True:
            value = first + self.rng.randrange(count) * multiple
            if value not in shown:
                return value


def declares(problem: problems.Problem) -> bool:
    return problem.variant == "pkb" and callable(getattr(problem.module, HOOK, None))


def draw_size(
    problem: problems.Problem, world_size: int, preset: str, rng: random.Random
) -> dict[str, Any] | None:
    """A size for `world_size` that the problem's rules accept and no preset is: the preset's values,
    with the hook's drawn over them; None when DRAWS tries find none."""
    base = problem.size(preset)
    presets = list(problem.sizes.values())
    draw = Draw(presets, rng)
    for _ in range(DRAWS):
        size = {**base, **getattr(problem.module, HOOK)(draw, world_size)}
        if size not in presets and not problem.module.check_world_size(world_size, size):
            return size
    return None


class Placement(NamedTuple):
    """Where an unseen-size trial runs: its world size and its size's values."""

    world_size: int
    size: dict[str, Any]


def placement(
    problem: problems.Problem, world_size: int, preset: str, rng: random.Random
) -> Placement | None:
    """Where the unseen trial runs: the largest smaller world size (of at least 2) the problem allows
    at a drawn size, else the run's own; None when no drawn size suits either."""
    for w in [*range(world_size - 1, 1, -1), world_size]:
        size = draw_size(problem, w, preset, rng)
        if size is not None:
            return Placement(w, size)
    return None


@dataclass(frozen=True)
class Generalization:
    """What the unseen trial found: `generalizes` ("yes", "no", or None when it could not judge) and
    the result's record of it."""

    generalizes: Literal["yes", "no"] | None
    unseen: UnseenResult | None


NOT_JUDGED = Generalization(None, None)


class _Linked(threading.Event):
    """An event set by its own `set()` or by its parent's: the launches poll `is_set()` only."""

    def __init__(self, parent: threading.Event | None) -> None:
        super().__init__()
        self.parent = parent

    def is_set(self) -> bool:
        return super().is_set() or (self.parent is not None and self.parent.is_set())


class Trial:
    """One trial of the reference and the candidate at a size the candidate was never shown.

    Drawn before the judged trials. Its candidate launch starts beside the judged trials' (`start`)
    where that saves time (`side_by_side`); otherwise, as on the process backend and at `large`
    (three or four launches' memory at once), its launches run after a pass. Beside them at the run's
    world size, the judged trials' reference launch runs its reference part too (`later`, then
    `take_reference`). Only a passing check's result reads it (`judge`); `discard`, which every check
    calls at its end, kills launches still running."""

    def __init__(self, run: Run, cancel: threading.Event | None = None) -> None:
        self.run = run
        self._cancel = _Linked(cancel)
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[tuple[LaunchOutcome | None, LaunchOutcome | None]] | None = None
        self._reference: LaunchOutcome | None = None  # its part of the judged trials' reference launch
        self._settled = threading.Event()  # that part given (take_reference), lost, or the trial discarded
        self._skip = ""  # why no trial: a note (nothing to judge) or a warning (a problem's fault)
        self._skip_is_warning = False
        self.placed: Placement | None = None
        self.seeds = [secrets.randbits(62)]
        p = run.problem
        if not declares(p):
            self._skip = (
                "no unseen-size trial: the original variant judges the original's shapes only"
                if p.variant != "pkb"
                else f"no unseen-size trial: problem {p.id} declares no unseen sizes"
            )
            return
        self._skip_is_warning = True
        try:
            self.placed = placement(p, run.world_size, run.size, random.Random(secrets.randbits(64)))
        except ValueError as exc:  # nothing left to draw (tests/test_unseen.py rules it out)
            self._skip = f"problem {p.id}'s unseen sizes cannot be drawn ({exc}): not judged"
            return
        if self.placed is None:
            self._skip = f"no unseen size of problem {p.id} suits world size {run.world_size}: not judged"

    @property
    def side_by_side(self) -> bool:
        """Whether the trial runs beside the judged trials: in isolated sandboxes (the candidate cannot
        read the reference's files), at the `pkb` size (three or four launches' memory at once), unless
        PKB_UNSEEN_BESIDE=0."""
        run = self.run
        small = run.size == "pkb" and not run.problem.lean_inputs
        return self.placed is not None and run.backend.isolated and small and config.unseen_beside()

    @property
    def later(self) -> LaterTrials | None:
        """The reference's part, for the judged trials' reference launch to run after its own trials:
        where the trial runs beside them at the run's world size and has no reference outcome yet
        (else None: a launch of its own, or none)."""
        if self._reference is not None or not self.side_by_side:
            return None
        if self.placed is None or self.placed[0] != self.run.world_size:
            return None
        return {"size": self.placed[1], "seeds": list(self.seeds)}

    def take_reference(self, outcome: LaunchOutcome) -> None:
        """Its reference part's outcome, from the launch that ran it after the judged trials (`later`;
        runs/references.py `split_outcome` splits that launch's outputs). Not given (the launch
        failed), `judge` runs it in a launch of its own."""
        self._reference = outcome
        self._settled.set()

    def reference_lost(self) -> None:
        """The judged trials' reference launch failed: its part will not be given (`judge` runs it in a
        launch of its own); a candidate launch waiting for it to know its expected outputs waits no more."""
        self._settled.set()

    def _given_reference(self) -> LaunchOutcome:
        """The reference part's outcome once the judged trials' reference launch gave it (`later`), for
        the candidate's expected outputs (judge.expecting_later); LookupError where it never came."""
        self._settled.wait(self.run.timeout_s + 60.0)
        if self._reference is None:
            raise LookupError("the reference's part of the unseen trial was not given")
        return self._reference

    def adopt(self, placed: Placement, seeds: list[int], reference: LaunchOutcome) -> None:
        """Run where a check's reference run ahead had it drawn (runs/references.py), at its seed, the
        reference's outcome given: only the candidate's launch is left."""
        self.placed, self.seeds, self._reference = placed, seeds, reference
        self._settled.set()
        self._skip, self._skip_is_warning = "", False

    def start(self, shared: bool = True) -> None:
        """Launch the trial now, beside the judged trials, where that is allowed (else `judge` runs it):
        the candidate's launch, and the reference's unless its outcome is given (`adopt`) or the
        judged trials' reference launch runs its part (`later`; not `shared`: that check launches no
        reference, its own having been run ahead)."""
        if self.side_by_side and self._future is None:
            in_theirs = shared and self.later is not None
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unseen")
            self._future = self._pool.submit(self._launch, self._reference is None and not in_theirs)

    def _launch(self, with_reference: bool = True) -> tuple[LaunchOutcome | None, LaunchOutcome | None]:
        assert self.placed is not None
        world_size, size = self.placed
        run = self.run
        candidate = run.launch_request("outputs", run.solution, self.seeds, size=size, world_size=world_size)
        if not with_reference:
            if self._reference is not None:  # adopted: its outputs are what the candidate's must be
                candidate = judge.expecting(candidate, self._reference)
            else:  # its reference part runs in the judged trials' reference launch: expected from that
                candidate = judge.expecting_later(candidate, self._given_reference)
            return None, run.run_one(candidate, self._cancel)
        reference = run.launch_request(
            "outputs", run.problem.path, self.seeds, size=size, world_size=world_size
        )
        return run.launch_pair(reference, candidate, self._cancel)

    def discard(self) -> None:
        """Kill the trial's launches if they still run, and wait for them to end."""
        self._cancel.set()
        self._settled.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def judge(self) -> Generalization:
        """The trial's outcome for a check that passed: its launches' (started, or run now), judged."""
        run = self.run
        if self.placed is None:
            (run.warnings if self._skip_is_warning else run.notes).append(self._skip)
            return NOT_JUDGED
        ref, cand = self._future.result() if self._future is not None else self._launch()
        world_size, size = self.placed
        if ref is None:  # its part of the judged trials' reference launch, else a launch of its own now
            own = run.launch_request(
                "outputs", run.problem.path, self.seeds, size=size, world_size=world_size
            )
            ref = self._reference or run.run_one(own, self._cancel)
        where = f"world size {world_size}, size {shown_size(run.problem, size)}"
        if not ref.ok or cand is None:
            bad = next(r for r in ref.ranks if r.state != "ok")
            run.warnings.append(
                f"the reference failed at the unseen {where} (rank {bad.rank}: {bad.error or bad.state}): "
                "not judged; this is pkb's fault, please report it"
            )
            return NOT_JUDGED
        key = tensorfile.result_key(self.seeds)
        ranks = judge_ranks(run.problem, world_size, [0], cand, ref, key, sources=run.sources)
        verdict, why = decide(ranks)
        generalizes: Literal["yes", "no"] = "yes" if verdict == "pass" else "no"
        message = f"matches the reference at {where}" if verdict == "pass" else f"at {where}: {why}"
        return Generalization(generalizes, UnseenResult(world_size=world_size, size=size, message=message))


def shown_size(problem: problems.Problem, size: dict[str, Any]) -> str:
    """The keys whose values differ from every preset's, as key=value (what makes the size unseen)."""
    presets = list(problem.sizes.values())
    changed = [k for k, v in size.items() if all(p.get(k) != v for p in presets)]
    return ", ".join(f"{k}={size[k]}" for k in changed) or "a new combination of the presets' values"
