"""The problem suite: discover `problems/NNN_slug.py` (the `pkb` variant) and
`problems/original/NNN_slug.py` (the `original` variant, docs/variants.md), validate each file's
metadata, look problems up.

A malformed problem is refused with one error naming the file and what is wrong (docs/problem-format.md
is the contract). Problem files are ours and trusted; candidate code never comes through here.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from harness import convention, tensorfile
from harness.context import DTYPES, ProblemContext
from pkb_mcp import catalogue
from pkb_mcp.catalogue import VARIANTS as VARIANTS  # re-exported: problems.VARIANTS, the suite's
from pkb_mcp.catalogue import WORDS, Entry, ProblemFormatError, read_entry
from pkb_mcp.errors import UserError

REQUIRED_PRESETS = {"pkb": ("pkb", "large"), "original": ("pkb",)}  # original: the original's shapes only
TRAFFIC_KEYS = ("nvlink_bytes", "hbm_bytes", "flops")
BOUNDS = ("atol", "rtol", "rel_norm")


@dataclass(frozen=True)
class Problem(Entry):
    """A problem imported: its catalogue entry's words (catalogue.py) and what its file computes."""

    sizes: dict[str, dict[str, Any]]
    tolerance: dict[str, float]  # every output's bounds ...
    output_tolerances: dict[int, dict[str, float]]  # ... except these outputs' own
    mutates_inputs: bool
    module: ModuleType
    variant: str = "pkb"
    lean_inputs: bool = False  # LEAN_INPUTS: inputs never copied (docs/problem-format.md)
    max_outputs: int = tensorfile.MAX_TENSORS  # MAX_OUTPUTS: tensors a result file may hold
    # PASSES_WITHOUT_EXCHANGE: why a solution that communicates nothing passes this workload (at every
    # world size, or at those a dict names); the eval report and the published table mark it
    passes_without_exchange: str | dict[int, str] | None = None
    # MINOR_EXCHANGE: why the exchange (NVLink + latency) stays under roofline.MATERIAL_SHARE of the
    # floor at `large`, W = 4, whatever the size (tests/test_comm_share.py holds each file to it)
    minor_exchange: str | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def bounds(self) -> dict[str, Any]:
        """The tolerance as the judge and the worker read it (harness.timing.output_bounds)."""
        if not self.output_tolerances:
            return dict(self.tolerance)
        return {**self.tolerance, "outputs": dict(self.output_tolerances)}

    @property
    def signature(self) -> str:
        return f"solution{inspect.signature(self.module.solution)}"

    def without_exchange(self, world_size: int) -> str | None:
        """Why a solution that communicates nothing passes at `world_size`, or None (it must)."""
        reason = self.passes_without_exchange
        return reason.get(world_size) if isinstance(reason, dict) else reason

    def size(self, preset: str) -> dict[str, Any]:
        if preset not in self.sizes:
            raise UserError(
                f"problem {self.id} has no size preset {preset!r}; choose one of {', '.join(self.sizes)}"
            )
        return self.sizes[preset]

    def world_size_error(self, world_size: int, preset: str) -> str | None:
        reason = self.module.check_world_size(world_size, self.size(preset))
        return str(reason) if reason else None

    def context(self, world_size: int, preset: str, rank: int = 0, device: str = "meta") -> ProblemContext:
        return ProblemContext(
            rank=rank,
            world_size=world_size,
            size=self.size(preset),
            dtype=self.torch_dtype,
            device=torch.device(device),
        )

    def input_shapes(self, world_size: int, preset: str, rank: int = 0) -> list[dict[str, Any]]:
        """Per-rank inputs as shapes and dtypes, built on the meta device (nothing allocated)."""
        inputs = self.module.make_inputs(self.context(world_size, preset, rank))
        inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        params = list(inspect.signature(self.module.solution).parameters)
        described = []
        for i, value in enumerate(inputs):
            name = params[i] if i < len(params) else f"arg{i}"
            if isinstance(value, torch.Tensor):
                described.append({"name": name, "shape": list(value.shape), "dtype": str(value.dtype)[6:]})
            else:
                described.append({"name": name, "value": repr(value)})
        return described

    def traffic(self, world_size: int, preset: str) -> dict[str, float]:
        t = dict(self.module.traffic(self.context(world_size, preset)))
        t.setdefault("rounds", 1 if t.get("nvlink_bytes", 0) > 0 else 0)
        return {k: float(v) for k, v in t.items()}


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"pkb_problems.p{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_problem(path: Path, variant: str = "pkb") -> Problem:
    """Load and validate one problem file of a variant, or raise ProblemFormatError naming the file."""
    entry = read_entry(path)  # the words `pkb problems` reads as text: a problem that loads is listed
    try:
        module = _load_module(path)
    except Exception as exc:
        raise ProblemFormatError(f"{path.name}: cannot be imported ({type(exc).__name__}: {exc})") from exc

    def need(name: str, kind: type | tuple[type, ...]) -> Any:
        if not hasattr(module, name):
            raise ProblemFormatError(f"{path.name}: missing {name}")
        value = getattr(module, name)
        if not isinstance(value, kind):
            raise ProblemFormatError(f"{path.name}: {name} must be {kind}")
        return value

    # the words as imported are those the catalogue read before the file's first function
    changed = [word for word in WORDS if getattr(module, word, None) != getattr(entry, word.lower())]
    if changed:
        raise ProblemFormatError(
            f"{path.name}: {', '.join(changed)} changed after the first function (pkb problems lists "
            "the value assigned before it)"
        )
    for fn in ("check_world_size", "make_inputs", "solution", "traffic"):
        if not callable(getattr(module, fn, None)):
            raise ProblemFormatError(f"{path.name}: missing function {fn}()")
    if entry.dtype not in DTYPES:
        raise ProblemFormatError(f"{path.name}: DTYPE {entry.dtype!r} is not one of {sorted(DTYPES)}")
    sizes = need("SIZES", dict)
    for preset in REQUIRED_PRESETS[variant]:
        if not isinstance(sizes.get(preset), dict):
            raise ProblemFormatError(f"{path.name}: SIZES needs a {preset!r} preset")
    if variant == "original" and set(sizes) != {"pkb"}:
        raise ProblemFormatError(f"{path.name}: an original variant has one preset, 'pkb' (the original's)")
    tolerance = need("TOLERANCE", dict)
    own = _output_tolerances(path.name, tolerance)
    flags, max_outputs = _options(path.name, module)
    problem = Problem(
        **{word.name: getattr(entry, word.name) for word in fields(Entry)} | {"path": path.resolve()},
        sizes=sizes,
        tolerance={k: float(tolerance[k]) for k in BOUNDS},
        output_tolerances={i: {k: float(b[k]) for k in BOUNDS} for i, b in sorted(own.items())},
        mutates_inputs=flags["MUTATES_INPUTS"],
        lean_inputs=flags["LEAN_INPUTS"],
        max_outputs=max_outputs,
        passes_without_exchange=_passes_without_exchange(path.name, module),
        minor_exchange=_minor_exchange(path.name, module),
        module=module,
        variant=variant,
    )
    try:
        traffic = problem.traffic(2, "pkb")
    except Exception as exc:
        raise ProblemFormatError(f"{path.name}: traffic() failed ({type(exc).__name__}: {exc})") from exc
    missing = [k for k in TRAFFIC_KEYS if k not in traffic]
    if missing:
        raise ProblemFormatError(f"{path.name}: traffic() lacks {', '.join(missing)}")
    why = convention.declaration_error(module, problem.size("pkb"), problem.torch_dtype)
    if why:
        raise ProblemFormatError(f"{path.name}: {why}")
    return problem


def _output_tolerances(file: str, tolerance: dict) -> dict:
    """TOLERANCE checked: its bounds, and its per-output bounds by index (returned)."""
    own = tolerance.get("outputs", {})
    if not isinstance(own, dict) or not all(type(i) is int and i >= 0 for i in own):
        raise ProblemFormatError(f"{file}: TOLERANCE['outputs'] maps output indices (0, 1, ...) to bounds")
    extra = set(tolerance) - {*BOUNDS, "outputs"}
    if extra:
        raise ProblemFormatError(f"{file}: TOLERANCE has unknown keys {sorted(extra)}")
    checked = [("TOLERANCE", tolerance), *((f"TOLERANCE['outputs'][{i}]", b) for i, b in own.items())]
    for where, bounds in checked:
        if not isinstance(bounds, dict) or (where != "TOLERANCE" and set(bounds) != set(BOUNDS)):
            raise ProblemFormatError(f"{file}: {where} must be a dict of exactly {', '.join(BOUNDS)}")
        for key in BOUNDS:
            if not isinstance(bounds.get(key), (int, float)) or bounds[key] < 0:
                raise ProblemFormatError(f"{file}: {where} needs a non-negative {key!r}")
    return own


def _options(file: str, module: Any) -> tuple[dict[str, bool], int]:
    """The optional declarations checked: the MUTATES_INPUTS and LEAN_INPUTS flags, MAX_OUTPUTS (returned)
    and the `canonical` hook."""
    flags = {flag: getattr(module, flag, False) for flag in ("MUTATES_INPUTS", "LEAN_INPUTS")}
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise ProblemFormatError(f"{file}: {flag} must be True or False")
    if flags["MUTATES_INPUTS"] and flags["LEAN_INPUTS"]:
        raise ProblemFormatError(
            f"{file}: LEAN_INPUTS cannot go with MUTATES_INPUTS (an in-place workload is called "
            "on a copy of its inputs, the copy lean inputs exist to avoid)"
        )
    max_outputs = getattr(module, "MAX_OUTPUTS", tensorfile.MAX_TENSORS)
    low, high = tensorfile.MAX_TENSORS, tensorfile.HARD_MAX_TENSORS
    if type(max_outputs) is not int or not low <= max_outputs <= high:
        raise ProblemFormatError(f"{file}: MAX_OUTPUTS must be an int from {low} (the default) to {high}")
    if hasattr(module, "canonical"):
        why = _canonical_error(module.canonical)
        if why:
            raise ProblemFormatError(f"{file}: canonical {why}")
    return flags, max_outputs


def _passes_without_exchange(file: str, module: Any) -> str | dict[int, str] | None:
    value = getattr(module, "PASSES_WITHOUT_EXCHANGE", None)
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    if (
        isinstance(value, dict)
        and value
        and all(
            type(w) is int and w >= 2 and isinstance(why, str) and why.strip() for w, why in value.items()
        )
    ):
        return dict(value)
    raise ProblemFormatError(
        f"{file}: PASSES_WITHOUT_EXCHANGE must be a sentence, or a dict of world sizes to sentences"
    )


def _minor_exchange(file: str, module: Any) -> str | None:
    value = getattr(module, "MINOR_EXCHANGE", None)
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ProblemFormatError(
        f"{file}: MINOR_EXCHANGE must be a sentence: why the exchange cannot be material"
    )


def _canonical_error(hook: object) -> str | None:
    """Why a problem's `canonical` is not a function of (outputs, inputs); None when it is."""
    if not callable(hook):
        return "must be a function canonical(outputs, inputs) -> outputs"
    try:
        inspect.signature(hook).bind(None, None)
    except TypeError:
        return "must take two arguments, (outputs, inputs)"
    except ValueError:  # a builtin without a signature: called as it is
        return None
    return None


@cache
def _loaded(path: Path, variant: str) -> Problem:
    """One problem file loaded once: `pkb show 1` imports that file alone."""
    return load_problem(path, variant)


def suite(variant: str = "pkb") -> dict[int, Problem]:
    """The problems of a variant by id (the `original` variant: those that have its file so far)."""
    return {pid: _loaded(e.path, variant) for pid, e in catalogue.entries(variant).items()}


def resolve(ref: int | str, variant: str = "pkb") -> Problem:
    """A problem by id (1, "1", "001") or name ("allreduce"), in a variant; only its own file is
    imported (the others are found by their text: catalogue.py)."""
    entries = catalogue.entries(variant)
    key = str(ref).strip()
    by_id = entries.get(int(key)) if key.isdigit() else None
    found = by_id or next((e for e in entries.values() if e.name == key.lower()), None)
    if found is not None:
        return _loaded(found.path, variant)
    if variant != "pkb":
        ours = resolve(ref)  # raises for a problem that does not exist at all
        raise UserError(f"problem {ours.id} ({ours.name}) has no {variant} variant yet; see docs/variants.md")
    raise UserError(f"problem {key} does not exist; see pkb problems")
