"""The original benchmark's calling convention, seen from the host: the requested convention checked,
what a launch says it chose turned into a result note, and a problem's original call described for
`pkb show` and `get_reference`. The in-sandbox side is harness/convention.py.
"""

from __future__ import annotations

from typing import Any

import torch

from harness import convention
from pkb_mcp.errors import UserError
from pkb_mcp.launches import LaunchOutcome
from pkb_mcp.models import OriginalConvention

# The note a result carries when a problem offered a choice of convention; `used_in` reads it back.
NOTE_PREFIX = "called in "
NOTE_TEXT = {"ours": "our convention", "original": "the original benchmark's convention"}


def requested(value: str | None) -> str:
    """The convention asked for, validated: auto (recognised from the signature), ours or original."""
    value = (value or "auto").lower()
    if value not in convention.CONVENTIONS:
        raise UserError(f"convention {value!r} is not one of {', '.join(convention.CONVENTIONS)}")
    return value


def notes(outcome: LaunchOutcome) -> list[str]:
    """One note saying how the candidate was called, when its launch recorded a choice."""
    record = outcome.convention or {}
    used = record.get("used")
    if used not in NOTE_TEXT:
        return []
    return [f"{NOTE_PREFIX}{NOTE_TEXT[used]} ({record.get('why', '')})"]


def used_in(result_notes: list[str]) -> str | None:
    """ "ours" or "original", from a result's notes; None when the launch recorded no choice."""
    for note in result_notes:
        for used, text in NOTE_TEXT.items():
            if note.startswith(NOTE_PREFIX + text):
                return used
    return None


def describe(problem: Any, world_size: int, preset: str) -> OriginalConvention | None:
    """The original's signature, the call the harness makes from our inputs, and the stated
    differences; None when the problem declares no original convention."""
    declared = convention.original_of(problem.module)
    if declared is None:
        return None
    build = declared.get("args")
    call = None
    if build is not None:
        inputs = problem.module.make_inputs(problem.context(world_size, preset))
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        names = list(convention.positional_of(problem.module.solution).names)  # type: ignore[union-attr]
        env = convention.meta_env(world_size, problem.size(preset), problem.torch_dtype)
        args = build(inputs, env)
        call = "solution(" + ", ".join(_describe(a, inputs, names, k) for k, a in enumerate(args)) + ")"
    return OriginalConvention(
        signature=declared["signature"],
        call=call,
        callable=build is not None,
        differences=str(declared.get("differences") or ""),
    )


def _describe(value: Any, inputs: tuple, names: list[str], position: int | None = None) -> str:
    """An argument in words: the input it is (the one at its own position first, since equal small
    ints are one object), a view of one, or its value."""
    if position is not None and position < min(len(inputs), len(names)) and value is inputs[position]:
        return names[position]
    if isinstance(value, torch.Tensor):
        for i, t in enumerate(inputs):
            name = names[i] if i < len(names) else f"input {i}"
            if value is t:
                return name
            if isinstance(t, torch.Tensor) and value._base is t:
                return f"view of {name} {list(value.shape)}"
        return f"new {str(value.dtype)[6:]}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v, inputs, names) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    for i, t in enumerate(inputs):
        if value is t and i < len(names):
            return names[i]
    return repr(value)
