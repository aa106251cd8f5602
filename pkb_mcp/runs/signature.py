"""Whether a candidate's solution() can take the call its problem makes, read from the file's text (it
is never imported): a solution that no call can bind is refused before any launch, naming the expected
signature, where a launch would end in a bare TypeError on every rank.

The calls are those harness/convention.py may make: our convention (the problem's inputs, positional)
and, where the problem declares one, the original benchmark's (`ORIGINAL['args']` built from shape-only
inputs). Only a plain `def solution` is judged (torch.no_grad() and its kin may decorate it); another
decorator, a class, an assignment, an import or anything dynamic (globals(), exec, setattr) may bind
another signature, and is let through.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from harness import convention
from pkb_mcp import problems

DYNAMIC = {"globals", "locals", "vars", "exec", "eval", "setattr", "__import__"}
# decorators that call the function with the arguments given, so its own parameters still decide
KEEPS_SIGNATURE = {"torch.no_grad", "torch.inference_mode", "torch.enable_grad"}
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Call:
    """A call the problem may make: its label, the signature it expects, the argument counts it passes."""

    label: str
    signature: str
    counts: tuple[int, ...]
    offered: bool = True  # named in a refusal (not so for an original call the problem cannot make)


def mismatch(
    problem: problems.Problem, tree: ast.Module, world_size: int, size: str, requested: str = "auto"
) -> str | None:
    """Why no call the problem may make (the conventions `requested` allows) can bind the module's
    solution(), in one sentence naming the expected signatures; None when one can or it cannot be told."""
    functions = solution_functions(tree)
    calls = possible_calls(problem, world_size, size, requested)
    if not functions or not calls:
        return None
    if any(binds(fn, n) for fn in functions for call in calls for n in call.counts):
        return None
    fn = functions[-1]
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    takes = f"{len(names)} parameter{'s' if len(names) != 1 else ''}" + (
        f" ({ast.unparse(fn.args)})" if names else ""
    )
    expected = " or ".join(f"{c.signature} ({c.label}, {_arguments(c.counts)})" for c in calls if c.offered)
    return f"solution takes {takes} here; expected {expected}"


def _arguments(counts: tuple[int, ...]) -> str:
    if len(counts) == 1:
        return f"{counts[0]} argument{'s' if counts[0] != 1 else ''}"
    return f"{counts[0]} to {counts[-1]} arguments"


def binds(fn: Function, count: int) -> bool:
    """Whether `count` positional arguments (and no keywords) bind `fn`'s parameters."""
    args = fn.args
    if any(default is None for default in args.kw_defaults):
        return False  # a keyword-only parameter without a default is never given
    positional = len(args.posonlyargs) + len(args.args)
    return positional - len(args.defaults) <= count and (args.vararg is not None or count <= positional)


def possible_calls(problem: problems.Problem, world_size: int, size: str, requested: str) -> list[Call]:
    """The calls harness/convention.py may make at this world size and size preset. Empty, so that
    nothing is judged, where a count cannot be found or the sandbox refuses the call for its own reason."""
    declared = convention.original_of(problem.module)
    calls: list[Call] = []
    if requested in ("auto", "ours"):
        count = _input_count(problem, world_size, size)
        if count is None:
            return []
        calls.append(Call("ours", problem.signature, (count,)))
    if declared is not None and requested in ("auto", "original"):
        callable_ = declared.get("args") is not None
        if not callable_ and requested == "original":
            return []  # the sandbox refuses the file, naming the problem's stated differences
        original = convention.parse_signature(declared["signature"])
        env = convention.meta_env(world_size, problem.size(size), problem.torch_dtype)
        arity = convention.call_arity(problem.module, env) if callable_ else None
        if arity is not None:
            counts: tuple[int, ...] = (arity,)
        elif original.varargs:
            return []
        else:
            # without a call to size, what the original's signature accepts: a file written to it is
            # let through, where ORIGINAL has no args, to hear in the sandbox why it cannot be called
            counts = tuple(range(original.required, len(original.names) + 1))
        calls.append(Call("the original benchmark's", declared["signature"], counts, offered=callable_))
    return calls


def _input_count(problem: problems.Problem, world_size: int, size: str) -> int | None:
    try:
        inputs = problem.module.make_inputs(problem.context(world_size, size))
    except Exception:
        return None
    return len(inputs) if isinstance(inputs, (tuple, list)) else 1


def solution_functions(tree: ast.Module) -> list[Function]:
    """The plain functions that may be the module's `solution` once it is imported: the last
    top-level `def solution`, or every one where some are under an if, a try or a loop. Empty when
    anything else may bind the name (a decorator, a class, an assignment, an import, a `global`
    statement, a star import or a dynamic lookup)."""
    if any(_may_rebind(node) for node in ast.walk(tree)):
        return []
    found: list[tuple[ast.stmt, bool]] = []
    _module_scope(tree.body, False, found)
    if not found or any(
        not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
        or not all(_keeps_signature(d) for d in stmt.decorator_list)
        for stmt, _ in found
    ):
        return []
    functions = [stmt for stmt, _ in found if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return functions if any(nested for _, nested in found) else functions[-1:]


def _may_rebind(node: ast.AST) -> bool:
    """Whether a node may bind `solution` other than by a def, or look names up dynamically."""
    if isinstance(node, ast.Name):
        return node.id in DYNAMIC or (node.id == "solution" and not isinstance(node.ctx, ast.Load))
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return node.attr == "solution" or (isinstance(node.value, ast.Name) and node.value.id == "solution")
    if isinstance(node, ast.Global):
        return "solution" in node.names
    if isinstance(node, ast.alias):
        return node.name == "*" or (node.asname or node.name) == "solution"
    if isinstance(node, (ast.MatchAs, ast.MatchStar, ast.ExceptHandler)):
        return node.name == "solution"
    return isinstance(node, ast.MatchMapping) and node.rest == "solution"


def _keeps_signature(decorator: ast.expr) -> bool:
    called = decorator.func if isinstance(decorator, ast.Call) and not decorator.args else decorator
    return ast.unparse(called) in KEEPS_SIGNATURE


def _module_scope(body: list[ast.stmt], nested: bool, found: list[tuple[ast.stmt, bool]]) -> None:
    """Definitions named solution in the module's own scope: its statements and those of its compound
    statements (if, try, with, loops, match), never a function's or a class's body."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if stmt.name == "solution":
                found.append((stmt, nested))
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                _module_scope(inner, True, found)
        for handler in getattr(stmt, "handlers", []):
            _module_scope(handler.body, True, found)
        for case in getattr(stmt, "cases", []):
            _module_scope(case.body, True, found)
