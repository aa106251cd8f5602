"""The unseen-size check: every check also judges the candidate on a size it was never shown.

An agent reads a problem's size presets (`pkb show`) and can write a kernel that works only there: a
shape test that skips the exchange elsewhere passes every judged trial. So each problem declares the
sizes it also runs at, `unseen_size(draw, world_size)` (docs/problem-format.md), and a check that
passed draws one of them per request, a value no preset uses for each key the hook draws, within the
problem's rules (its `check_world_size`). Where the run has more than two ranks, the trial also moves
to a smaller world size the problem allows (W = 4 runs it at 3, else 2: a kernel written for one W
fails), within the GPUs the run holds.

The reference and the candidate each run one trial there in launches of their own, after the judged
trials: nothing at the unseen size changes the verdict. The result says apart whether the candidate
`generalizes`. The original variant judges the original's shapes only, as the original benchmark
does: it has no unseen sizes.
"""

from __future__ import annotations

import random
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Literal

from harness import tensorfile
from pkb_mcp import problems
from pkb_mcp.models import UnseenResult
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


def placement(
    problem: problems.Problem, world_size: int, preset: str, rng: random.Random
) -> tuple[int, dict[str, Any]] | None:
    """Where the unseen trial runs: the largest smaller world size (of at least 2) the problem allows
    at a drawn size, else the run's own; None when no drawn size suits either."""
    for w in [*range(world_size - 1, 1, -1), world_size]:
        size = draw_size(problem, w, preset, rng)
        if size is not None:
            return w, size
    return None


@dataclass(frozen=True)
class Generalization:
    """What the unseen trial found: `generalizes` ("yes", "no", or None when it could not judge) and
    the result's record of it."""

    generalizes: Literal["yes", "no"] | None
    unseen: UnseenResult | None


NOT_JUDGED = Generalization(None, None)


def judge(run: Run, cancel: threading.Event | None = None) -> Generalization:
    """One trial of the reference and the candidate at a size it was never shown."""
    p = run.problem
    if not declares(p):
        why = (
            "the original variant judges the original's shapes only"
            if p.variant != "pkb"
            else f"problem {p.id} declares no unseen sizes"
        )
        run.notes.append(f"no unseen-size trial: {why}")
        return NOT_JUDGED
    rng = random.Random(secrets.randbits(64))
    try:
        placed = placement(p, run.world_size, run.size, rng)
    except ValueError as exc:  # the hook's ranges leave nothing to draw (tests/test_unseen.py rules it out)
        run.warnings.append(f"problem {p.id}'s unseen sizes cannot be drawn ({exc}): not judged")
        return NOT_JUDGED
    if placed is None:
        run.warnings.append(f"no unseen size of problem {p.id} suits world size {run.world_size}: not judged")
        return NOT_JUDGED
    world_size, size = placed
    seeds = [secrets.randbits(62)]
    ref, cand = run.launch_pair(
        run.launch("outputs", p.path, seeds, size=size, world_size=world_size),
        run.launch("outputs", run.solution, seeds, size=size, world_size=world_size),
        cancel,
    )
    where = f"world size {world_size}, size {shown_size(p, size)}"
    if not ref.ok or cand is None:
        bad = next(r for r in ref.ranks if r.state != "ok")
        run.warnings.append(
            f"the reference failed at the unseen {where} (rank {bad.rank}: {bad.error or bad.state}): "
            "not judged; this is pkb's fault, please report it"
        )
        return NOT_JUDGED
    ranks = judge_ranks(p, world_size, [0], cand, ref, tensorfile.result_key(seeds), sources=run.sources)
    verdict, why = decide(ranks)
    generalizes: Literal["yes", "no"] = "yes" if verdict == "pass" else "no"
    message = f"matches the reference at {where}" if verdict == "pass" else f"at {where}: {why}"
    return Generalization(generalizes, UnseenResult(world_size=world_size, size=size, message=message))


def shown_size(problem: problems.Problem, size: dict[str, Any]) -> str:
    """The keys whose values differ from every preset's, as key=value (what makes the size unseen)."""
    presets = list(problem.sizes.values())
    changed = [k for k, v in size.items() if all(p.get(k) != v for p in presets)]
    return ", ".join(f"{k}={size[k]}" for k in changed) or "a new combination of the presets' values"
