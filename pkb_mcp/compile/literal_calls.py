"""A solution's `load_inline` calls read from its text, where the text alone fixes every argument.

The discovery launch (harness/discover.py) imports a solution in the sandbox to learn what its
extensions are; every edit of a kernel's source is a new text, so it costs a launch each time. Most
agent-written solutions need none: module-level source strings passed to `load_inline` under names
that nothing rebinds. This module reads the syntax tree (the host reads candidate files as text
only; nothing here runs them) and returns the calls in the form discovery records them, or None
whenever anything is not plainly literal, so that discovery decides: another builder
(`load`, `compile_cuda_extension`), `load_inline` reached any other way than a call by its imported
name, `*args` or `**kwargs`, an argument a request does not keep (build folders, include paths,
precompiled headers, SYCL), or a value other than literals, concatenations of them and module-level
names bound once to such values.

A call found here that the solution then never makes costs a build and nothing else: the launch
builds what the solution really asks for itself (harness/extensions.py).
"""

from __future__ import annotations

import ast
from typing import Any

from harness.extensions import KEPT_ARGUMENTS
from harness.original.utils.cuda_helpers import DEFAULT_CUDA_FLAGS
from pkb_mcp import python_text

MAX_CALLS = 64
KEYWORDS = (*KEPT_ARGUMENTS, "verbose")  # what a request keeps, and `verbose`, which changes nothing
POSITIONAL = ("name", "cpp_sources", "cuda_sources")  # the same in every torch this project meets
MODULE = "torch.utils.cpp_extension"
# the original benchmark's helper (harness/original/utils/cuda_helpers.py), as the load_inline it makes
HELPER_MODULE, HELPER = "utils.cuda_helpers", "compile_cuda_extension"
HELPER_POSITIONAL = ("name", "cuda_src", "extra_cuda_cflags", "extra_cflags", "extra_ldflags", "verbose")


class NotLiteral(Exception):
    """Something the text alone does not fix: discovery must import the solution."""


def _binding_counts(tree: ast.Module) -> dict[str, int]:
    """How often each name is bound anywhere in the file: assigned, deleted, declared global or
    nonlocal, defined, imported or taken as a parameter."""
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names = [node.id]
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names = list(node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [(node.asname or node.name).split(".")[0]]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _bindings(tree: ast.Module, counts: dict[str, int]) -> dict[str, ast.expr]:
    """Names bound exactly once in the whole file, by a plain assignment at module level."""
    values: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
    return {name: value for name, value in values.items() if counts.get(name) == 1}


def _value(node: ast.expr, bound: dict[str, ast.expr], depth: int = 0) -> Any:
    if depth > 20:
        raise NotLiteral("too deep")
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str | bool)):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(e, bound, depth + 1) for e in node.elts]
    if isinstance(node, ast.Name) and node.id in bound:
        return _value(bound[node.id], bound, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, bound, depth + 1), _value(node.right, bound, depth + 1)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
    raise NotLiteral(ast.dump(node)[:80])


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise NotLiteral("not strings")
    return values


def _arguments(
    node: ast.Call, positional: tuple[str, ...], keywords: tuple[str, ...], bound: dict[str, ast.expr]
) -> dict[str, Any]:
    if len(node.args) > len(positional) or any(isinstance(a, ast.Starred) for a in node.args):
        raise NotLiteral("positional arguments")
    given = {positional[i]: _value(a, bound) for i, a in enumerate(node.args)}
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg not in keywords or keyword.arg in given:
            raise NotLiteral(f"argument {keyword.arg}")
        given[keyword.arg] = _value(keyword.value, bound)
    return given


def _helper_call(node: ast.Call, bound: dict[str, ast.expr]) -> dict[str, Any]:
    """A `compile_cuda_extension` call as the `load_inline` call it makes."""
    given = _arguments(node, HELPER_POSITIONAL, HELPER_POSITIONAL, bound)
    if "cuda_src" not in given:
        raise NotLiteral("cuda_src")
    return {
        "name": given.get("name"),
        "cpp_sources": "",
        "cuda_sources": given["cuda_src"],
        "extra_cuda_cflags": [*DEFAULT_CUDA_FLAGS, *_strings(given.get("extra_cuda_cflags"))],
        "extra_cflags": given.get("extra_cflags"),
        "extra_ldflags": given.get("extra_ldflags"),
    }


def _call(node: ast.Call, given: dict[str, Any]) -> dict[str, Any]:
    """One call's arguments in discovery's form (harness/discover.py `Recorder.load_inline`)."""
    if not isinstance(given.get("name"), str) or "cpp_sources" not in given:
        raise NotLiteral("name or cpp_sources")
    functions = given.get("functions")
    flags = {
        "is_python_module": given.get("is_python_module", True),
        "with_pytorch_error_handling": given.get("with_pytorch_error_handling", True),
        "no_implicit_headers": given.get("no_implicit_headers", False),
    }
    with_cuda = given.get("with_cuda")
    if not all(isinstance(v, bool) for v in flags.values()) or not isinstance(with_cuda, bool | None):
        raise NotLiteral("flags")
    return {
        "api": "load_inline",
        "name": given["name"],
        "line": node.lineno,
        "cpp_sources": _strings(given["cpp_sources"]),
        "cuda_sources": _strings(given.get("cuda_sources")),
        "sources": [],
        "functions": None if functions is None else _strings(functions),
        "extra_cflags": _strings(given.get("extra_cflags")),
        "extra_cuda_cflags": _strings(given.get("extra_cuda_cflags")),
        "extra_ldflags": _strings(given.get("extra_ldflags")),
        "extra_include_paths": [],
        "with_cuda": with_cuda,
        **flags,
        "build_directory": False,
    }


def _callee_names(tree: ast.Module) -> tuple[set[str], set[str], set[str]] | None:
    """The names torch's `load_inline`, torch.utils.cpp_extension and the original's helper are
    imported under at module level; None when the file imports another builder (torch's `load`)."""
    direct: set[str] = set()
    modules: set[str] = set()
    helpers: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == MODULE and alias.name == "load_inline":
                    direct.add(alias.asname or alias.name)
                elif node.module == MODULE and alias.name in ("load", "*"):
                    return None
                elif node.module == "torch.utils" and alias.name == "cpp_extension":
                    modules.add(alias.asname or alias.name)
                elif node.module == HELPER_MODULE and alias.name == HELPER:
                    helpers.add(alias.asname or alias.name)
                elif node.module == HELPER_MODULE:
                    return None
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == MODULE and a.asname)
            if any(a.name == HELPER_MODULE for a in node.names):
                return None
    return direct, modules, helpers


def _mentions(node: ast.AST, names: set[str], modules: set[str]) -> int:
    """1 where the node names a builder: by a name it is imported under, as an attribute of anything,
    or torch's `load` on the module."""
    if isinstance(node, ast.Name):
        return int(node.id in names)
    if isinstance(node, ast.Attribute):
        on_module = isinstance(node.value, ast.Name) and node.value.id in modules
        return int(node.attr in ("load_inline", HELPER) or (node.attr == "load" and on_module))
    return 0


def literal_calls(text: str) -> list[dict[str, Any]] | None:
    """Every `load_inline` call of the text in discovery's form, or None when the text alone does
    not fix them all (or has none, or uses another builder)."""
    try:
        tree = python_text.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    names = _callee_names(tree)
    if names is None:
        return None
    direct, modules, helpers = names
    counts = _binding_counts(tree)
    if any(counts.get(n) != 1 for n in direct | modules | helpers):  # rebound after its import
        return None
    bound = _bindings(tree, counts)
    calls: list[dict[str, Any]] = []
    mentions = 0  # every mention of the builder must be a call read here (not a value passed on)
    try:
        for node in ast.walk(tree):
            mentions += _mentions(node, direct | helpers | {"load_inline", HELPER}, modules)
            if isinstance(node, ast.Call):
                func = node.func
                by_name = isinstance(func, ast.Name) and func.id in direct
                by_module = (
                    isinstance(func, ast.Attribute)
                    and func.attr == "load_inline"
                    and isinstance(func.value, ast.Name)
                    and func.value.id in modules
                )
                if by_name or by_module:
                    calls.append(_call(node, _arguments(node, POSITIONAL, KEYWORDS, bound)))
                elif isinstance(func, ast.Name) and func.id in helpers:
                    calls.append(_call(node, _helper_call(node, bound)))
    except (NotLiteral, RecursionError):
        return None
    if not calls or mentions != len(calls) or len(calls) > MAX_CALLS:
        return None
    return calls
