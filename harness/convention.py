"""How a candidate's solution() is called: our convention, or the original ParallelKernelBench's.

Files written for the original benchmark expect its call: its signature, constants such as eps or a
block size, src/dst ranks, lists of tensors, process groups. A problem that can be called that way
declares `ORIGINAL` (docs/problem-format.md): the original's signature as text, `args(inputs, env)`
building the original's argument tuple from our inputs, optionally `outputs(result, args, env)`
mapping its return back to ours and `groups(env)` creating the process groups it needs, and the
`differences` between our workload and the original's. `args` is None where the original's call
cannot produce our outputs (a workload changed to fix a flaw): such a file is refused, naming why.

`bind` is called once per launch on every rank, after the candidate is imported: it recognises the
convention from the candidate's signature (or is told), creates the groups, and returns the callable
the worker judges and times in place of the candidate's solution. In our convention that is the
candidate's own function, unchanged; in the original's, a call that builds the arguments (constant
time: references, constants, the launch's groups), calls the candidate and maps the outputs.

Imports torch and the standard library only: it runs in the sandbox.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from harness.contracts import ConventionRecord, RankConfig

CONVENTIONS = ("auto", "ours", "original")
RECORD = "convention.json"  # rank 0's record of what it chose (informational: the host's notes)


class ConventionError(Exception):
    """The candidate cannot be called in the convention asked for or recognised."""


@dataclass
class Env:
    """What an `ORIGINAL` declaration's callables see: the launch's rank, world size, size preset,
    device and dtype, the WORLD group and the groups `groups(env)` created."""

    rank: int
    world_size: int
    size: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    world: Any = None
    groups: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Positional:
    """The positional parameters of a signature: names, how many are required, whether *args."""

    names: tuple[str, ...]
    required: int
    varargs: bool = False

    def accepts(self, count: int) -> bool:
        return self.required <= count and (self.varargs or count <= len(self.names))


def parse_signature(text: str) -> Positional:
    """The positional parameters of a signature written as text, `solution(a: T, b: int = 0) -> R`.
    Annotations are parsed, never evaluated. Raises ValueError when the text is not a signature."""
    try:
        tree = ast.parse(f"def {text.strip()}:\n    pass")
    except SyntaxError as exc:
        raise ValueError(f"not a Python signature: {exc.msg}") from None
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, ast.FunctionDef) or fn.name != "solution":
        raise ValueError("the signature must be of a function named solution")
    params = [*fn.args.posonlyargs, *fn.args.args]
    return Positional(
        names=tuple(p.arg for p in params),
        required=len(params) - len(fn.args.defaults),
        varargs=fn.args.vararg is not None,
    )


def positional_of(fn: Callable[..., Any]) -> Positional | None:
    """The positional parameters of a callable, or None when its signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    return Positional(
        names=tuple(p.name for p in positional),
        required=sum(p.default is inspect.Parameter.empty for p in positional),
        varargs=any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params),
    )


def original_of(problem: ModuleType) -> dict[str, Any] | None:
    declared = getattr(problem, "ORIGINAL", None)
    return declared if isinstance(declared, dict) else None


def meta_env(world_size: int, size: dict[str, Any], dtype: torch.dtype, rank: int = 0) -> Env:
    """An Env on the meta device, for describing or sizing a call without running one: no process
    group exists there, so the WORLD group and every declared group are named placeholders."""
    return Env(
        rank,
        world_size,
        size,
        torch.device("meta"),
        dtype,
        world=Placeholder("WORLD"),
        groups=_Placeholders(),
    )


class Placeholder:
    """Stands for a process group where none exists (the host describing a call)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"<{self.label} process group>"


class _Placeholders(dict):
    def __missing__(self, key: str) -> Placeholder:
        return Placeholder(key)


def call_arity(problem: ModuleType, env: Env) -> int | None:
    """How many arguments the original's call passes, found by building it from shape-only inputs."""
    from harness.context import ProblemContext

    declared = original_of(problem)
    if declared is None or declared.get("args") is None:
        return None
    meta = meta_env(env.world_size, env.size, env.dtype, env.rank)
    ctx = ProblemContext(
        rank=env.rank, world_size=env.world_size, size=env.size, dtype=env.dtype, device=meta.device
    )
    try:
        inputs = problem.make_inputs(ctx)
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        return len(declared["args"](inputs, meta))
    except Exception:
        return None


def recognise(
    candidate: Callable[..., Any], problem: ModuleType, arity: int | None, requested: str = "auto"
) -> tuple[str, str]:
    """(convention, why) for a candidate: "ours" or "original"."""
    if requested not in CONVENTIONS:
        raise ConventionError(f"convention {requested!r} is not one of {', '.join(CONVENTIONS)}")
    declared = original_of(problem)
    if requested == "ours":
        return "ours", "asked for"
    if declared is None:
        if requested == "original":
            raise ConventionError(
                f"problem {problem.ID} declares no original calling convention; write the solution with "
                "the reference's signature (pkb show) and pass --convention ours"
            )
        return "ours", "the problem declares no original convention"
    if requested == "original":
        return "original", "asked for"
    cand = positional_of(candidate)
    ours = positional_of(problem.solution)
    orig = parse_signature(declared["signature"])
    if cand is None or ours is None:
        return "ours", "its signature cannot be read; ours is the default"
    if cand.names == ours.names:
        return "ours", "its parameters are the reference's"
    if cand.names == orig.names:
        return "original", "its parameters are the original benchmark's"
    fits_ours = cand.accepts(len(ours.names))
    fits_orig = cand.accepts(arity if arity is not None else orig.required)
    if fits_ours != fits_orig:
        which = "ours" if fits_ours else "original"
        return which, f"it takes the number of arguments the {_label(which)} passes"
    lowered = {n.lower() for n in cand.names}
    near_ours = len(lowered & {n.lower() for n in ours.names})
    near_orig = len(lowered & {n.lower() for n in orig.names})
    if near_ours != near_orig:
        which = "ours" if near_ours > near_orig else "original"
        return which, f"its parameter names are closer to the {_label(which)}'s"
    return "ours", "both conventions fit it; ours is the default (--convention original overrides)"


def _label(convention: str) -> str:
    return "reference" if convention == "ours" else "original benchmark"


def bind(
    candidate: Callable[..., Any], problem: ModuleType, cfg: RankConfig, device: torch.device
) -> Callable[..., Any]:
    """The callable the worker judges and times for this candidate (called once per launch, on every
    rank, with the process group up). Rank 0 records the choice in the launch directory."""
    import torch.distributed as dist

    from harness.context import DTYPES

    env = Env(
        rank=int(cfg["rank"]),
        world_size=dist.get_world_size(),
        size=cfg["size"],
        device=device,
        dtype=DTYPES[cfg["dtype"]],
        world=dist.group.WORLD,
    )
    requested = str(cfg.get("convention") or "auto")
    used, why = recognise(candidate, problem, call_arity(problem, env), requested)
    declared = original_of(problem)
    if used == "original" and declared is not None and declared.get("args") is None:
        raise ConventionError(
            f"problem {problem.ID} cannot run a file in the original benchmark's convention: "
            f"{declared['differences']} Write it to the reference's signature (pkb show {problem.ID}); "
            "--convention ours calls it that way"
        )
    if env.rank == 0:
        _record(Path(cfg["launch_dir"]), {"requested": requested, "used": used, "why": why})
    if used == "ours":
        return candidate
    assert declared is not None
    make_groups = declared.get("groups")
    if make_groups is not None:
        env.groups = dict(make_groups(env))  # collective: every rank, once per launch, in the same order
    build: Callable[[tuple, Env], tuple] = declared["args"]
    back: Callable[[Any, tuple, Env], Any] | None = declared.get("outputs")

    def original_call(*inputs: Any) -> Any:
        args = build(inputs, env)
        result = candidate(*args)
        return result if back is None else back(result, args, env)

    return original_call


def _record(launch_dir: Path, record: ConventionRecord) -> None:
    part = launch_dir / f"{RECORD}.part"
    part.write_text(json.dumps(record))
    os.replace(part, launch_dir / RECORD)


def aliasing_faults(
    problem: ModuleType, rank: int, world_size: int, outputs: list, inputs: list, aliased: list[int]
) -> list[int]:
    """Which aliased outputs break the contract: all of them, but an output that is exactly one of
    the tensors the inputs hold (`inputs`: every one, those inside lists too) where the problem
    updates its inputs in place (`MUTATES_INPUTS`: the in-place result returned, as torch's in-place
    ops return it) or on a rank where the problem says the workload returns its input there
    (`input_returned(rank, world_size)`, the original's contract for rooted collectives; that input
    must still be unchanged, checked apart). Outputs are copied at return."""
    returns_input = getattr(problem, "input_returned", None)
    in_place = bool(getattr(problem, "MUTATES_INPUTS", False))
    if not aliased or not (in_place or (returns_input is not None and returns_input(rank, world_size))):
        return aliased
    return [i for i in aliased if not any(_same_tensor(outputs[i], t) for t in inputs)]


def _same_tensor(a: Any, b: Any) -> bool:
    return (
        isinstance(b, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


DECLARATION_KEYS = {"signature", "args", "outputs", "groups", "differences"}


def declaration_error(problem: ModuleType, size: dict[str, Any], dtype: torch.dtype) -> str | None:
    """What is wrong with a problem's `ORIGINAL` and `input_returned` (None when nothing): the loader
    refuses the file with it. The call is built once from shape-only inputs at the smallest world
    size the problem allows, so a builder that cannot run fails here and not in a launch."""
    returns_input = getattr(problem, "input_returned", None)
    if returns_input is not None and not callable(returns_input):
        return "input_returned must be a function (rank, world_size) -> bool"
    if not hasattr(problem, "ORIGINAL"):
        return None
    declared = problem.ORIGINAL
    if not isinstance(declared, dict):
        return "ORIGINAL must be a dict (docs/problem-format.md)"
    unknown = set(declared) - DECLARATION_KEYS
    if unknown:
        return f"ORIGINAL has unknown keys {sorted(unknown)}"
    if not isinstance(declared.get("signature"), str):
        return "ORIGINAL needs the original's signature as text, 'solution(...)'"
    try:
        parse_signature(declared["signature"])
    except ValueError as exc:
        return f"ORIGINAL['signature']: {exc}"
    for key in ("args", "outputs", "groups"):
        if declared.get(key) is not None and not callable(declared[key]):
            return f"ORIGINAL[{key!r}] must be callable or None"
    if not isinstance(declared.get("differences", ""), str):
        return "ORIGINAL['differences'] must be text"
    if declared.get("args") is None:
        if not declared.get("differences"):
            return "ORIGINAL without args must state its differences: why the original cannot be called"
        return None
    allowed = [w for w in (2, 4, 8) if not problem.check_world_size(w, size)]
    if not allowed:
        return None
    env = meta_env(allowed[0], size, dtype)
    if call_arity(problem, env) is None:
        return f"ORIGINAL['args'] fails on shape-only inputs at world size {allowed[0]}"
    return None
