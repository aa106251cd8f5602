"""Find the extensions a solution builds, by importing it inside the sandbox (a discovery launch).

Run as a script: `python -I -B discover.py SOLUTION OUT`. It replaces torch's `load_inline` and `load`
with recorders, imports the solution (its module-level code runs: this is candidate code, so only ever
inside the sandbox), then looks for the calls that did not run at import time, the usual lazy pattern
of building on the first call of solution():

    _ext = None
    def solution(x):
        global _ext
        if _ext is None:
            _ext = load_inline(name="ar", cpp_sources=CPP, cuda_sources=CUDA, functions=["run"])

Each such call's arguments are evaluated in the imported module's namespace: module-level strings and
the constants they are built from, simple local assignments before the call in its function, and the
function's own parameters bound from the call sites that pass them. What cannot be evaluated is left
out. OUT receives JSON: {"calls": [...], "error": null or {...}, "stand_ins": [...]}; the host parses it
as untrusted (pkb_mcp/compile/). Stdlib only (torch is imported from the solution's environment).
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

BUILDERS = ("load_inline", "load", "compile_cuda_extension")
ORIGINAL_PACKAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "original")


class Anything:
    """A stand-in value: any attribute, call or index gives another stand-in."""

    def __init__(self, label: str) -> None:
        self._label = label

    def __getattr__(self, attr: str) -> Anything:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Anything(self._label + "." + attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Anything:
        return Anything(self._label + "()")

    def __getitem__(self, key: Any) -> Anything:
        return Anything(self._label + "[]")

    def __repr__(self) -> str:
        return "<pkb stand-in for " + self._label + ">"


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str | os.PathLike):
        value = [value]
    return [os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in value]


class Recorder:
    def __init__(self, solution: str) -> None:
        self.solution = solution
        self.calls: list[dict[str, Any]] = []
        self.line: int | None = None  # set while evaluating a call found in the source

    def _caller_line(self) -> int | None:
        if self.line is not None:
            return self.line
        frame: types.FrameType | None = sys._getframe(3)
        while frame is not None:
            if os.path.abspath(frame.f_code.co_filename) == self.solution:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def _record(self, api: str, name: Any, **fields: Any) -> Anything:
        self.calls.append(
            {
                "api": api,
                "name": str(name),
                "line": self._caller_line(),
                "lazy": self.line is not None,
                **fields,
            }
        )
        return Anything("extension " + str(name))

    def load_inline(
        self,
        name: Any,
        cpp_sources: Any,
        cuda_sources: Any = None,
        sycl_sources: Any = None,
        functions: Any = None,
        extra_cflags: Any = None,
        extra_cuda_cflags: Any = None,
        extra_sycl_cflags: Any = None,
        extra_ldflags: Any = None,
        extra_include_paths: Any = None,
        build_directory: Any = None,
        verbose: Any = False,
        with_cuda: Any = None,
        with_sycl: Any = None,
        is_python_module: Any = True,
        with_pytorch_error_handling: Any = True,
        keep_intermediates: Any = True,
        use_pch: Any = False,
        no_implicit_headers: Any = False,
        **unknown: Any,
    ) -> Anything:
        if isinstance(functions, str):
            functions = [functions]
        return self._record(
            "load_inline",
            name,
            cpp_sources=_strings(cpp_sources),
            cuda_sources=_strings(cuda_sources),
            sources=[],
            functions=None if functions is None else [str(f) for f in functions],
            extra_cflags=_strings(extra_cflags),
            extra_cuda_cflags=_strings(extra_cuda_cflags),
            extra_ldflags=_strings(extra_ldflags),
            extra_include_paths=_strings(extra_include_paths),
            with_cuda=None if with_cuda is None else bool(with_cuda),
            is_python_module=bool(is_python_module),
            with_pytorch_error_handling=bool(with_pytorch_error_handling),
            no_implicit_headers=bool(no_implicit_headers),
            build_directory=build_directory is not None,
        )

    def load(
        self,
        name: Any,
        sources: Any,
        extra_cflags: Any = None,
        extra_cuda_cflags: Any = None,
        extra_sycl_cflags: Any = None,
        extra_ldflags: Any = None,
        extra_include_paths: Any = None,
        **unknown: Any,
    ) -> Anything:
        return self._record(
            "load",
            name,
            cpp_sources=[],
            cuda_sources=[],
            functions=None,
            sources=_strings(sources),
            extra_cflags=_strings(extra_cflags),
            extra_cuda_cflags=_strings(extra_cuda_cflags),
            extra_ldflags=_strings(extra_ldflags),
            extra_include_paths=_strings(extra_include_paths),
        )


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Triton is absent on CPU machines; a stand-in lets a solution that also uses it import."""

    def __init__(self, used: list[str]) -> None:
        self.used = used

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "triton" or fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def module_getattr(attr: str, label: str = spec.name) -> Anything:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Anything(label + "." + attr)

        module.__getattr__ = module_getattr  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if "triton" not in self.used:
            self.used.append("triton")


def _callee(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _evaluate(node: ast.expr, namespace: dict[str, Any], local: dict[str, Any], filename: str) -> Any:
    return eval(compile(ast.Expression(body=node), filename, "eval"), namespace, local)


def _call_arguments(
    call: ast.Call, namespace: dict[str, Any], local: dict[str, Any], filename: str
) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = [], {}
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            args.extend(_evaluate(arg.value, namespace, local, filename))
        else:
            args.append(_evaluate(arg, namespace, local, filename))
    for keyword in call.keywords:
        if keyword.arg is None:
            kwargs.update(_evaluate(keyword.value, namespace, local, filename))
        else:
            kwargs[keyword.arg] = _evaluate(keyword.value, namespace, local, filename)
    return args, kwargs


def _local_values(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    before: int,
    namespace: dict[str, Any],
    start: dict[str, Any],
    filename: str,
) -> dict[str, Any]:
    """The function's simple assignments `name = expression` that come before line `before`."""
    local = dict(start)
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and node.lineno < before
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                local[node.targets[0].id] = _evaluate(node.value, namespace, local, filename)
            except Exception:
                continue
    return local


def _bindings(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    tree: ast.Module,
    namespace: dict[str, Any],
    filename: str,
) -> list[dict[str, Any]]:
    """The function's parameters as its call sites in the module bind them (defaults where unbound)."""
    target = namespace.get(function.name)
    try:
        signature = inspect.signature(target) if callable(target) else None
    except (TypeError, ValueError):
        signature = None
    if signature is None:
        return [{}]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node.func) == function.name:
            try:
                args, kwargs = _call_arguments(node, namespace, {}, filename)
                bound = signature.bind_partial(*args, **kwargs)
            except Exception:
                continue
            bound.apply_defaults()
            found.append(dict(bound.arguments))
    if not found:
        bound = signature.bind_partial()
        bound.apply_defaults()
        found.append(dict(bound.arguments))
    return found


def _original_helper(*args: Any, **kwargs: Any) -> Any:
    """The original benchmark's helper, whose load_inline call the recorder sees."""
    from utils.cuda_helpers import compile_cuda_extension  # harness/original, on sys.path

    return compile_cuda_extension(*args, **kwargs)


def record_lazy_calls(tree: ast.Module, namespace: dict[str, Any], recorder: Recorder, filename: str) -> None:
    """Record the builder calls in the source that did not run at import time."""
    ran = {call["line"] for call in recorder.calls}
    enclosing: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call):
                    enclosing.setdefault(id(inner), node)  # the outermost function holding the call
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _callee(node.func) in BUILDERS) or node.lineno in ran:
            continue
        named_sources = any(k.arg == "sources" for k in node.keywords)
        if _callee(node.func) == "load" and not named_sources and len(node.args) < 2:
            continue  # some other function called load
        builders: dict[str, Callable[..., Any]] = {
            "load_inline": recorder.load_inline,
            "load": recorder.load,
            "compile_cuda_extension": _original_helper,
        }
        builder = builders[str(_callee(node.func))]
        function = enclosing.get(id(node))
        envs = _bindings(function, tree, namespace, filename) if function is not None else [{}]
        for env in envs:
            local = _local_values(function, node.lineno, namespace, env, filename) if function else {}
            try:
                args, kwargs = _call_arguments(node, namespace, local, filename)
            except Exception:
                continue
            recorder.line = node.lineno
            try:
                builder(*args, **kwargs)
            except TypeError:
                continue
            finally:
                recorder.line = None
            break


def main(solution: str, out_path: str) -> None:
    solution = os.path.abspath(solution)
    sys.path.insert(0, os.path.dirname(solution))
    sys.path.append(ORIGINAL_PACKAGES)
    recorder = Recorder(solution)
    stand_ins: list[str] = []
    error = None
    module = None
    try:
        import torch.utils.cpp_extension as cpp_extension

        cpp_extension.load_inline = recorder.load_inline  # type: ignore[assignment]
        cpp_extension.load = recorder.load  # type: ignore[assignment]
        if importlib.util.find_spec("triton") is None:
            sys.meta_path.append(StandInFinder(stand_ins))
        spec = importlib.util.spec_from_file_location("pkb_candidate_solution", solution)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except BaseException as exc:
        frames = [
            [f.lineno, f.name, f.line or ""]
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename) == solution
        ]
        error = {
            "type": type(exc).__name__,
            "message": str(exc),
            "frames": frames,
            "line": frames[-1][0] if frames else None,
            "column": None,
        }
        if isinstance(exc, SyntaxError) and exc.filename and os.path.abspath(exc.filename) == solution:
            error.update(message=exc.msg, line=exc.lineno, column=exc.offset)
    if module is not None and error is None:
        try:
            with open(solution, encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=solution)
            record_lazy_calls(tree, vars(module), recorder, solution)
        except Exception:
            pass  # what was recorded at import time still stands
    with open(out_path + ".part", "w") as out:
        json.dump({"calls": recorder.calls, "error": error, "stand_ins": stand_ins}, out)
    os.replace(out_path + ".part", out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
