"""pkb's protections: the checks pkb applies that the original benchmark's harness does not, each
under a short stable name, and which of them failed a candidate that is correct by the original's
rules (docs/variants.md, "pkb's protections in the original variant").

The original's rules, as its harness (run_local.py and utils/) judges a trial: every rank's saved
outputs against the reference's, the same nesting and number of outputs, the same shape, and
`torch.allclose` of both cast to float32 at its tolerance (atol = rtol = 1e-2: the `original`
variant's TOLERANCE), NaN never close. Nothing else: not the dtype, not whether an output is an
input's memory or an input changed, not the outputs of timed calls.

In the `original` variant a candidate that pkb fails, while every rank's outputs meet those rules in
every trial, is "correct by the original benchmark's rules": its result names the protections that
failed it and its message leads with that. The original's rules judge pkb's own launches (pkb's
inputs, one process for every trial), so protections that act through the inputs or the launch are
kept but never named: secret seeds (a candidate that predicts the original's fixed seeds is wrong
by either rule here), state kept across trials (the original starts a process per trial), the
sandbox, the tamper checks and the keyed result files. Where a problem updates its inputs in place,
the inputs judged after the call count as outputs under both rules (no `original` file does so yet).

May import: harness, pkb_mcp.launches, pkb_mcp.models, pkb_mcp.problems, pkb_mcp.runs.judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness import structure as output_structure
from harness import tensorfile
from harness.timing import output_bounds
from pkb_mcp.launches import LaunchOutcome, Outputs
from pkb_mcp.models import RankResult
from pkb_mcp.problems import Problem
from pkb_mcp.runs.judge import aliased_output

# Every protection pkb names, in the order a message names them: what pkb checks that the original
# harness does not. docs/variants.md lists the same names.
PROTECTIONS: dict[str, str] = {
    "aliasing": "an output may not share memory with an input",
    "mutation": "inputs must be unchanged after a call, judged or timed, unless the problem updates them",
    "dtype": "each output's dtype must be the reference's (the original compares values cast to float32)",
    "exact": "integer and boolean outputs must equal the reference's (the original allows its tolerance)",
    "nonfinite": "an infinity fails, even where the reference has the same one",
    "float64": "the elementwise bound is computed in float64 (the original computes it in float32)",
    "norm_bound": "each output's relative error norm is bounded (no `original` file sets a bound yet)",
    "timed_outputs": "every timed call's output must equal the judged output of the same inputs",
    "fresh_inputs": "timed calls on input sets never seen before are judged too",
}
LEAD = "correct by the original benchmark's rules; fails pkb's: "


@dataclass(frozen=True)
class Breach:
    """A protection that failed a rank (or a whole launch: rank None) whose outputs meet the
    original's rules, with pkb's words for it."""

    protection: str
    detail: str
    rank: int | None = None
    trial: int | None = None

    def where(self) -> str:
        if self.rank is None:
            return ""
        return f"rank {self.rank}" + (f", trial {self.trial}" if self.trial is not None else "") + ": "


def original_rules(got: Outputs, want: Outputs, tolerance: dict[str, Any]) -> str | None:
    """Why one rank's outputs of one trial fail the original benchmark's rules, or None when they meet
    them. The bounds are the problem's (the original's, in the `original` variant)."""
    if (differs := output_structure.difference(got.tree(), want.tree())) is not None:
        return f"outputs of another structure ({differs})"
    for i, (g, w) in enumerate(zip(got.tensors, want.tensors, strict=True)):
        if g.shape != w.shape:
            return f"output {i} has shape {list(g.shape)}, expected {list(w.shape)}"
        bounds = output_bounds(tolerance, i)
        gf, wf = g.reshape(-1), w.reshape(-1)
        for start in range(0, gf.numel(), 1 << 22):  # chunks bound host memory; allclose is elementwise
            gc, wc = gf[start : start + (1 << 22)].float(), wf[start : start + (1 << 22)].float()
            if not torch.allclose(gc, wc, atol=bounds["atol"], rtol=bounds["rtol"]):
                return f"output {i} is not allclose at atol {bounds['atol']:.3g}, rtol {bounds['rtol']:.3g}"
    return None


def breaches(rank: int, trial: int | None, got: Outputs, want: Outputs, judged: RankResult) -> list[Breach]:
    """The protections that failed these outputs, which meet the original's rules and which pkb
    judged `judged` (a `wrong` result): each flag the outputs carry, then what pkb's comparison found."""
    found: list[Breach] = []

    def add(name: str, detail: str) -> None:
        found.append(Breach(name, detail, rank, trial))

    if (aliased := aliased_output(got)) is not None:
        add("aliasing", f"{aliased} shares memory with an input")
    if (mutated := got.flagged("mutated_inputs")) is not None:
        add("mutation", f"{mutated} was changed by the solution")
    for i, (g, w) in enumerate(zip(got.tensors, want.tensors, strict=True)):
        if g.dtype != w.dtype:
            add("dtype", f"output {i} is {str(g.dtype)[6:]}, expected {str(w.dtype)[6:]}")
            break
    if found:
        return found
    first = judged.first_mismatch
    if first is not None:
        w = want.tensors[first.output]
        if not (w.dtype.is_floating_point or w.dtype.is_complex):
            add("exact", judged.message)
        elif _shared_infinity(got.tensors[first.output], w):
            add("nonfinite", f"output {first.output} has an infinity where the reference has the same")
        else:
            add("float64", judged.message)
    else:  # every element within its bounds: what failed is the relative error norm
        add("norm_bound", judged.message)
    return found


def _shared_infinity(got: torch.Tensor, want: torch.Tensor) -> bool:
    both = torch.isinf(got) & torch.isinf(want) & (got == want)
    return bool(both.any())


def _readable(
    outcome: LaunchOutcome, key: int, rank: int, fresh: bool, mac_key: bytes | None
) -> Outputs | None:
    """A rank's outputs of one trial as the harness wrote them: None where missing or altered."""
    got = (outcome.fresh_outputs if fresh else outcome.outputs).get((key, rank))
    if got is None:
        return None
    if mac_key is not None and not tensorfile.verify(mac_key, got.structure, got.tensors, got.meta):
        return None
    return got


def named_in(problem: Problem) -> bool:
    """Whether a run of this problem names its protections: in the `original` variant, where the
    original's rules are the workload's own."""
    return problem.variant == "original"


def judged_outputs(
    problem: Problem,
    keys: list[int],
    cand: LaunchOutcome,
    ref: LaunchOutcome,
    ranks: list[RankResult],
    mac_key: bytes | None = None,
) -> list[Breach] | None:
    """The protections that failed the candidate's judged outputs (check trials, or a benchmark's
    replayed input sets) where every rank's outputs meet the original's rules in every trial of
    `keys`; None where some rank's do not (or failed otherwise: raised, crashed, timed out), or where
    nothing failed. `ranks` are pkb's results (runs/verdicts.judge_ranks); a rank they pass meets the
    original's rules too (pkb's bounds are the original's there, computed in float64)."""
    failed = [r for r in ranks if r.state != "pass"]
    if not named_in(problem) or not failed or any(r.state != "wrong" or r.trial is None for r in failed):
        return None
    found: list[Breach] = []
    for r in failed:
        for key in keys:
            got = _readable(cand, key, r.rank, False, mac_key)
            want = ref.outputs.get((key, r.rank))
            if got is None or want is None or original_rules(got, want, problem.bounds) is not None:
                return None
        assert r.trial is not None
        got, want = cand.outputs[(r.trial, r.rank)], ref.outputs[(r.trial, r.rank)]
        named = breaches(r.rank, r.trial, got, want, r)
        if not named:
            return None  # pkb failed it for a reason not named here: it is not counted as the original's
        found += named
    return found


def fresh_outputs(
    problem: Problem, ranks: list[RankResult], cand: LaunchOutcome, mac_key: bytes | None = None
) -> list[Breach] | None:
    """A benchmark failed on its fresh input sets: `fresh_inputs`, where each rank that failed there
    returned outputs the harness wrote (wrong values, not a crash or a forged file); else None. The
    original judges no timed call, so what a timed call returns is never its concern."""
    failed = [r for r in ranks if r.state != "pass"]
    if not named_in(problem) or not failed or any(r.state != "wrong" or r.trial is None for r in failed):
        return None
    for r in failed:
        assert r.trial is not None
        if _readable(cand, r.trial, r.rank, True, mac_key) is None:
            return None
    lead = min(failed, key=lambda r: r.rank)
    return [Breach("fresh_inputs", f"wrong on a fresh input set: {lead.message}", lead.rank, lead.trial)]


def timed_calls(problem: Problem, protection: str | None, why: str) -> list[Breach] | None:
    """A benchmark whose outputs were right, refused by `protection` over its timed calls
    (runs/verdicts.refused_timing): the breach, where the variant names it; else None."""
    if protection is None or not named_in(problem):
        return None
    return [Breach(protection, why)]


def names(found: list[Breach]) -> list[str]:
    """The protections of `found`, each once, in PROTECTIONS' order."""
    named = {b.protection for b in found}
    return [p for p in PROTECTIONS if p in named]


def message(found: list[Breach]) -> str:
    """The verdict's message: the lead, then each protection once, with the first breach's details."""
    parts = []
    for name in names(found):
        first = next(b for b in found if b.protection == name)
        parts.append(f"{name}: {first.where()}{first.detail}")
    return LEAD + "; ".join(parts)
