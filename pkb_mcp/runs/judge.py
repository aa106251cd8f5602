"""Correctness on the host: a candidate's outputs against the reference's, for one rank of one trial.

The structure must match exactly: the nesting, and every non-tensor part of the output (None,
ints, floats, strings, torch.Size; harness/structure.py).
Shape and dtype must match exactly. Each floating or complex output must pass, on its own bounds, an
elementwise allclose (|out − ref| <= atol + rtol·|ref|, in float64 / complex128: for a complex
output | | is the modulus, of the difference and of the reference) AND a relative-norm
bound ‖out − ref‖ / ‖ref‖ <= rel_norm, so that a large output cannot hide an error in a small one;
a NaN or infinity the reference does not have fails. Integer and boolean outputs must be equal.
Outputs aliasing inputs, and inputs changed by a solution that must not change them, fail whatever
the values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from harness import structure as output_structure
from harness import tensorfile
from harness.timing import output_bounds
from pkb_mcp.launches import LaunchOutcome, LaunchRequest, Outputs
from pkb_mcp.models import Mismatch, RankResult

CHUNK = 1 << 22  # elements compared at a time, to bound host memory on large outputs


def _fmt(value: torch.Tensor) -> str:
    v = value.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def header_mismatch(mismatch: tensorfile.Mismatch) -> str:
    """What `compare` would say of a file whose header differs from the expected outputs (its data
    never read): its aliasing or mutation flag first, as compare names them, else the difference."""
    flags = Outputs("tuple", [], mismatch.meta)
    if (aliased := flags.flagged("aliased_outputs")) is not None:
        return f"{aliased} shares memory with an input; return new tensors"
    if (mutated := flags.flagged("mutated_inputs")) is not None:
        return f"{mutated} was changed by the solution; inputs are read-only"
    return str(mismatch)


def compare(rank: int, trial: int, got: Outputs, want: Outputs, tol: dict[str, Any]) -> RankResult:
    """The verdict for one rank's outputs in one trial: each output on its own bounds (the problem's
    TOLERANCE, or the output's entry in TOLERANCE["outputs"])."""

    def wrong(message: str, **fields: object) -> RankResult:
        return RankResult(rank=rank, trial=trial, state="wrong", message=message, **fields)  # type: ignore[arg-type]

    if (aliased := aliased_output(got)) is not None:
        return wrong(f"{aliased} shares memory with an input; return new tensors")
    if (mutated := got.flagged("mutated_inputs")) is not None:
        return wrong(f"{mutated} was changed by the solution; inputs are read-only")
    if (differs := output_structure.difference(got.tree(), want.tree())) is not None:
        return wrong(differs)
    names = want.tensor_names()
    for i, (g, w) in enumerate(zip(got.tensors, want.tensors, strict=True)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return wrong(
                f"{names[i]} is {str(g.dtype)[6:]}{list(g.shape)}, expected {str(w.dtype)[6:]}{list(w.shape)}"
            )

    max_abs = 0.0
    max_rel = 0.0
    mismatched = 0
    first: Mismatch | None = None
    first_bounds: dict[str, float] = {}
    norms: list[float] = []
    for i, (g, w) in enumerate(zip(got.tensors, want.tensors, strict=True)):
        bounds = output_bounds(tol, i)
        exact = not (w.dtype.is_floating_point or w.dtype.is_complex)
        wide = torch.complex128 if w.dtype.is_complex else torch.float64
        gf, wf = g.reshape(-1), w.reshape(-1)
        err_sq = 0.0
        ref_sq = 0.0
        for start in range(0, gf.numel(), CHUNK):
            gc = gf[start : start + CHUNK]
            wc = wf[start : start + CHUNK]
            if torch.equal(gc, wc):  # bit for bit (a NaN never equals itself: those take the long way)
                ref_abs = wc.to(wide).abs()
                ref_sq += float(torch.dot(ref_abs, ref_abs))
                continue
            if exact:
                bad = gc != wc
                diff = (gc.to(torch.float64) - wc.to(torch.float64)).abs_()
                ref_abs = wc.to(torch.float64).abs_()
            else:
                g64, w64 = gc.to(wide), wc.to(wide)
                diff = (g64 - w64).abs()
                ref_abs = w64.abs()
                nonfinite = ~torch.isfinite(g64) & torch.isfinite(w64)
                bad = ~(diff <= bounds["atol"] + bounds["rtol"] * ref_abs) | nonfinite
                diff = torch.nan_to_num_(diff, nan=math.inf)  # |a - b| is NaN where either is
            n_bad = int(bad.sum())
            if n_bad and first is None:
                flat = start + int(bad.nonzero()[0, 0])
                index = list(torch.unravel_index(torch.tensor(flat), g.shape)) if g.dim() else []
                first = Mismatch(
                    output=i, index=[int(x) for x in index], expected=_fmt(wf[flat]), got=_fmt(gf[flat])
                )
                first_bounds = bounds
            mismatched += n_bad
            if diff.numel():
                max_abs = max(max_abs, float(diff.max()))
                max_rel = max(max_rel, float((diff / ref_abs.clamp_min(1e-30)).max()))
                err_sq += float(torch.dot(diff, diff))
                ref_sq += float(torch.dot(ref_abs, ref_abs))
        # an all-zero reference output has no relative norm: the elementwise test alone judges it
        zero_ref = 0.0 if err_sq == 0 else math.nan
        norms.append(math.sqrt(err_sq) / math.sqrt(ref_sq) if ref_sq > 0 else zero_ref)
    judged = [(i, n) for i, n in enumerate(norms) if not math.isnan(n)]
    fields = {
        "max_abs_error": max_abs,
        "max_rel_error": max_rel,
        "rel_norm_error": max((n for _, n in judged), default=0.0),
        "mismatched": mismatched,
        "first_mismatch": first,
    }
    many = len(want.tensors) > 1 or isinstance(want.structure, list)  # a tree: name the tensor
    if mismatched:
        total = sum(t.numel() for t in want.tensors)
        assert first is not None
        where = f"{names[first.output]} " if many else ""
        return wrong(
            f"{mismatched} of {total} elements differ; first at {where}index {first.index}: "
            f"expected {first.expected}, got {first.got} (bounds atol {first_bounds['atol']:.3g}, "
            f"rtol {first_bounds['rtol']:.3g})",
            **fields,
        )
    for i, n in judged:
        bound = output_bounds(tol, i)["rel_norm"]
        if not n <= bound:  # written so that NaN fails
            what = f"of {names[i]} " if many else ""
            return wrong(f"relative error norm {what}{n:.3g} exceeds {bound:.3g}", **fields)
    return RankResult(rank=rank, trial=trial, state="pass", **fields)  # type: ignore[arg-type]


def aliased_output(got: Outputs) -> str | None:
    """The first output the harness saw sharing an input's memory, named; None when none did."""
    flagged = got.meta.get("aliased_outputs")
    if not isinstance(flagged, list) or not flagged:
        return None
    names = got.tensor_names()
    first = flagged[0]
    return names[first] if type(first) is int and 0 <= first < len(names) else got.flagged("aliased_outputs")


# what the host reads of a launch besides its output files, at the caps pkb_mcp/launches.py reads
# them with: launch.json, a rank log's tail per rank, timing.json, convention.json
RECORDS_BYTES = (1 << 20) + (64 << 20) + 4096
RANK_LOG_BYTES = 8 * 1024


def expected_files(reference: LaunchOutcome, trials: int | None = None) -> dict[str, tensorfile.Expected]:
    """The output files a candidate's launch must leave, by name, each with what the reference's
    launch of the same inputs left there: for a check's launch, trials 0 to `trials` - 1 of every
    rank (`t{trial}_r{rank}`); for a benchmark's (`trials` None), every input set's first output
    (`s{set}_r{rank}`) and every fresh call's (`f{call}_r{rank}`)."""
    files: dict[str, tensorfile.Expected] = {}
    if trials is not None:
        for (trial, rank), out in reference.outputs.items():
            if trial < trials:
                files[f"t{trial}_r{rank}.pkbt"] = tensorfile.Expected.of(out.structure, out.tensors)
        return files
    for (index, rank), out in reference.outputs.items():
        files[f"s{index}_r{rank}.pkbt"] = tensorfile.Expected.of(out.structure, out.tensors)
    for (index, rank), out in reference.fresh_outputs.items():
        files[f"f{index}_r{rank}.pkbt"] = tensorfile.Expected.of(out.structure, out.tensors)
    return files


def read_budget(expected: dict[str, tensorfile.Expected], world_size: int) -> int:
    """The bytes the host may read of a candidate's launch: its expected output files at most, and
    its records and rank logs at their caps."""
    return sum(e.file_bytes for e in expected.values()) + RECORDS_BYTES + world_size * RANK_LOG_BYTES


def expecting(request: LaunchRequest, reference: LaunchOutcome) -> LaunchRequest:
    """A candidate's launch request that expects what the reference's launch of the same inputs left
    (`expected_files`), its read budget cut to that; unchanged where the reference failed."""
    if not reference.ok:
        return request
    files = expected_files(reference, _trials(request))
    budget = read_budget(files, request.settings["world_size"])
    return replace(request, expected=lambda: files, read_budget=min(request.read_budget, budget))


def expecting_later(request: LaunchRequest, reference: Callable[[], LaunchOutcome]) -> LaunchRequest:
    """A candidate's launch request whose expectation comes from a reference's launch that runs beside
    it: `reference()` (which waits for that launch) is asked once the candidate's has ended; nothing
    is expected where it failed or raised."""
    trials = _trials(request)

    def expected() -> dict[str, tensorfile.Expected] | None:
        try:
            outcome = reference()
        except Exception:  # cancelled, or the launch itself failed: judged (or raised) elsewhere
            return None
        return expected_files(outcome, trials) if outcome.ok else None

    return replace(request, expected=expected)


def _trials(request: LaunchRequest) -> int | None:
    return None if request.settings["mode"] == "benchmark" else len(request.settings["seeds"])


def reference_budget() -> int:
    """The bytes the host may read of a reference's launch: half the node's memory, where what it
    reads is kept (a reference's outputs are the problem's, not bounded by an expectation)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 8 << 30
