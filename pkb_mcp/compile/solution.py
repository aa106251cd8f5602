"""A `.py` solution: a discovery launch imports it in the sandbox to find its load_inline / load calls (also
those made on solution()'s first call), then each extension is checked (nvcc for CUDA, a syntax-only host
compiler run for C++) and, where the node can, built for the extension cache in the same build launch.

Offers `compile_solution`. Imports pkb_mcp.compile.cache, extensions, flags, headers, results, toolchain
and units."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from pkb_mcp.compile.cache import Cache, cached_result, read_source
from pkb_mcp.compile.extensions import TIMED_OUT, ToolRunner, discover, parse_requests
from pkb_mcp.compile.extensions import toolchain as launch_toolchain
from pkb_mcp.compile.flags import choose_host_flags, choose_nvcc_flags, prebuild_refusal
from pkb_mcp.compile.headers import check_key, check_set, prepare_soon
from pkb_mcp.compile.headers import enabled as headers_enabled
from pkb_mcp.compile.results import CompileError, CompileResult, Diagnostic, tool_message
from pkb_mcp.compile.toolchain import (
    EXTENSION_STD,
    Nvcc,
    cxx_argv,
    host_compiler,
    nvcc_argv,
    optional_nvcc,
    stand_in_dir,
    stand_in_notes,
    toolchain_fingerprint,
)
from pkb_mcp.compile.units import (
    Command,
    LineMap,
    UnitPlan,
    command_material,
    run_plans,
    safe_identifier,
    time_left,
    unit_result,
)

# load_inline prepends these lines to the sources it writes (unless no_implicit_headers=True).
_INLINE_CUDA_PREFIX = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")


_INLINE_CPP_PREFIX = ("#include <torch/extension.h>",)


class _RecordedCall(BaseModel):
    """A builder call as harness/discover.py reports it (untrusted: validated, sizes capped upstream)."""

    api: Literal["load_inline", "load"]
    name: str
    line: int | None = None
    lazy: bool = False  # found in the source, not run at import time
    cpp_sources: list[str] = Field(default_factory=list)
    cuda_sources: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    functions: list[str] | None = None
    extra_cflags: list[str] = Field(default_factory=list)
    extra_cuda_cflags: list[str] = Field(default_factory=list)
    extra_ldflags: list[str] = Field(default_factory=list)
    extra_include_paths: list[str] = Field(default_factory=list)
    with_cuda: bool | None = None
    is_python_module: bool = True
    with_pytorch_error_handling: bool = True
    no_implicit_headers: bool = False
    build_directory: bool = False


class _ImportFailure(BaseModel):
    type: str
    message: str
    frames: list[tuple[int, str, str]] = Field(default_factory=list)
    line: int | None = None
    column: int | None = None


class _Recording(BaseModel):
    calls: list[_RecordedCall] = Field(default_factory=list)
    error: _ImportFailure | None = None
    stand_ins: list[str] = Field(default_factory=list)


def _record_extensions(
    text: str, tools: ToolRunner, deadline: float, timeout_s: float
) -> _Recording | Diagnostic:
    """The solution's builder calls, from a discovery launch in the sandbox (kept per solution text)."""
    found = discover(text, tools, time_left(deadline))
    if isinstance(found, str):
        if found.startswith(TIMED_OUT):
            return tool_message(
                f"build timed out after {timeout_s:g} s while importing the solution "
                "(module-level code must finish quickly)"
            )
        return tool_message(found, tool="python")
    try:
        return _Recording.model_validate(found)
    except ValidationError:
        return tool_message("the discovery launch returned malformed data; the solution was not checked")


def _import_diagnostic(failure: _ImportFailure, display: str) -> Diagnostic:
    lines = [f"{failure.type}: {failure.message}"]
    if failure.frames:
        lines.append("traceback (solution frames only):")
        for lineno, func, text in failure.frames[-8:]:
            lines.append(f"  {display}:{lineno} in {func}: {text.strip()}")
    if "CUDA" in failure.message or "cuda" in failure.message:
        lines.append("module-level code runs without a GPU here; keep CUDA calls inside solution()")
    return Diagnostic(
        file=display,
        line=failure.line,
        column=failure.column,
        severity="error",
        message="\n".join(lines)[:2000],
        tool="python",
    )


def compile_solution(
    text: str, *, display: str, arch: str, cache: Cache, tools: ToolRunner, deadline: float, timeout_s: float
) -> CompileResult:
    """Check (and, where the node can, build) the extensions of a solution's text, or take it from `cache`."""
    start = time.monotonic()
    syntax = _syntax_error(text, display)
    if syntax is not None:
        return _failed(display, arch, syntax, start)
    nvcc = optional_nvcc()
    material: dict[str, object] = {
        "level": "solution",
        "arch": arch,
        "display": display,
        "source": text,
        "toolchain": toolchain_fingerprint(nvcc),
    }
    key = cache.key(material)
    cached = cached_result(cache, key)
    if cached is not None:
        return cached

    recorded = _record_extensions(text, tools, deadline, timeout_s)
    work = tools.new_dir()
    try:
        if isinstance(recorded, Diagnostic):
            return _failed(display, arch, recorded, start)
        diagnostics = [_import_diagnostic(recorded.error, display)] if recorded.error else []
        notes = _recording_notes(recorded, text)
        py_lines = text.splitlines()
        plans = []
        for n, call in enumerate(recorded.calls):
            unit_work = work / f"unit{n}"
            unit_work.mkdir()
            plans.append(
                _plan_extension(
                    call,
                    n,
                    recorded.calls,
                    nvcc=nvcc,
                    work=unit_work,
                    arch=arch,
                    py_lines=py_lines,
                    display=display,
                    notes=notes,
                )
            )
        prebuild = _buildable([call.model_dump() for call in recorded.calls], notes)
        _ask_for_headers(recorded.calls, tools)
        ran, prepared = run_plans(plans, cache, tools, work, deadline, prebuild)
        units = [unit_result(plan, r, timeout_s) for plan, r in zip(plans, ran, strict=True)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = set(prepared.built + prepared.cached)
    if any(
        c.api == "load_inline" and c.functions is not None and c.name not in built for c in recorded.calls
    ):
        notes.append(
            "pybind11 bindings that load_inline generates from functions= were not built; only "
            "that each named function is declared in cpp_sources was checked"
        )
    inputs: dict[str, str] = {}
    for plan in plans:
        inputs.update(plan.inputs)
    unit_texts = [s for call in recorded.calls for s in (*call.cuda_sources, *call.cpp_sources)]
    notes += stand_in_notes(nvcc, [*unit_texts, *(read_source(p) for p in inputs)])
    notes = list(dict.fromkeys(notes))
    ok = not any(d.severity == "error" for d in diagnostics) and all(u.ok for u in units)
    result = CompileResult(
        ok=ok,
        kind="solution",
        source=display,
        arch=arch,
        units=units,
        diagnostics=diagnostics,
        build_time_s=round(time.monotonic() - start, 3),
        cache_hit=bool(units) and all(u.cache_hit for u in units),
        notes=notes,
    )
    if not any(d.tool == "pkb" and d.severity == "error" for d in result.all_diagnostics()):
        cache.store(key, result.model_copy(update={"cache_hit": False}), inputs)
    if prepared.notes():  # what happened now, not kept with the cached result
        result = result.model_copy(update={"notes": [*result.notes, *prepared.notes()]})
    return result


def _syntax_error(text: str, display: str) -> Diagnostic | None:
    """A syntax error of the source, found by compiling it (which runs nothing), or None."""
    try:
        compile(text, display, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Diagnostic(
            file=display,
            line=exc.lineno,
            column=exc.offset,
            severity="error",
            message=f"{type(exc).__name__}: {exc.msg}",
            tool="python",
        )
    except ValueError as exc:  # e.g. NUL bytes
        raise CompileError(f"{display} is not valid Python source ({exc}); fix the file") from exc
    return None


def _failed(display: str, arch: str, diagnostic: Diagnostic, start: float) -> CompileResult:
    """A result for a solution that could not be looked into: it does not parse or import."""
    return CompileResult(
        ok=False,
        kind="solution",
        source=display,
        arch=arch,
        diagnostics=[diagnostic],
        build_time_s=round(time.monotonic() - start, 3),
        cache_hit=False,
    )


def _recording_notes(recorded: _Recording, text: str) -> list[str]:
    """What the discovery says about the solution's extensions, for the result's notes."""
    notes: list[str] = []
    if recorded.stand_ins:
        notes.append(
            f"{', '.join(recorded.stand_ins)} is not installed here; a stand-in module let the "
            "solution import, so its kernels were not checked"
        )
    if not recorded.calls:
        if re.search(r"\bload_inline\b|\bcpp_extension\b", text):
            notes.append(
                "the file uses torch.utils.cpp_extension but no load_inline/load call was found: "
                "pass its sources as module-level strings (or constants built from them) so they "
                "can be checked here"
            )
        else:
            notes.append("no CUDA extension (load_inline / load) found; nothing to build")
    if any(call.lazy for call in recorded.calls):
        notes.append(
            "load_inline calls that run on solution()'s first call were found in the source and "
            "checked with the values their arguments have after import"
        )
    return notes


def _buildable(calls: list[dict[str, Any]], notes: list[str]) -> list[Any]:
    """The recorded load_inline calls this node can build for the extension cache: C++ everywhere,
    CUDA where torch was built with CUDA."""
    wanted, _ = parse_requests(calls)
    if launch_toolchain()["torch_cuda"] != "None":
        return wanted
    cuda = [r.name for r in wanted if r.cuda_sources]
    if cuda:
        notes.append(
            f"extension {', '.join(cuda)} was checked, not built: this node's torch has no CUDA, so it "
            "is built by the first check on a GPU node"
        )
    return [r for r in wanted if not r.cuda_sources]


def _check_header(call: _RecordedCall) -> str | None:
    """The key of torch's precompiled header that the syntax check of the call's C++ source may use
    (compile/headers.py check_key), or None where the call is no build request."""
    found, _ = parse_requests([call.model_dump()]) if headers_enabled() else ([], [])
    return check_key(found[0], launch_toolchain()) if found else None


def _ask_for_headers(calls: Sequence[_RecordedCall], tools: ToolRunner) -> None:
    """Ask for the headers of the calls' syntax checks that the cache lacks, for the checks after this
    one (in the background: this one compiles as it always did)."""
    found, _ = parse_requests([call.model_dump() for call in calls])
    prepare_soon([check_set(r) for r in found if prebuild_refusal(r) is None], tools)


_Sources = list[tuple[Path, str, LineMap]]


def _inline_sources(
    call: _RecordedCall, name: str, work: Path, py_lines: list[str], display: str
) -> tuple[_Sources, _Sources, list[Diagnostic]]:
    """The files load_inline would write for the call (CUDA, C++), each mapped back to the .py lines
    of its strings, and what is wrong before any compiler runs (functions= names nothing declared)."""
    cuda_files: _Sources = []
    cpp_files: _Sources = []
    for strings, prefix, file_name, files in (
        (call.cuda_sources, _INLINE_CUDA_PREFIX, "cuda.cu", cuda_files),
        (call.cpp_sources, _INLINE_CPP_PREFIX, "main.cpp", cpp_files),
    ):
        if not any(s.strip() for s in strings):
            continue
        lead = [] if call.no_implicit_headers else list(prefix)
        generated = work / file_name
        generated.write_text("\n".join([*lead, *strings]), encoding="utf-8")
        label = f"{name}/{'cuda' if file_name == 'cuda.cu' else 'cpp'}_sources"
        line_map = LineMap(str(generated), len(lead), strings, py_lines, display, label)
        files.append((generated, f"{name}/{file_name}", line_map))
    known = []
    cpp_text = "\n".join(call.cpp_sources)
    for function in call.functions or []:
        if not re.search(rf"\b{re.escape(function)}\b", cpp_text):
            known.append(
                Diagnostic(
                    file=display,
                    line=call.line,
                    severity="warning",
                    tool="pkb",
                    message=f"functions= names {function!r} but cpp_sources does not "
                    "declare it; the generated binding would not compile",
                )
            )
    return cuda_files, cpp_files, known


def _plan_extension(
    call: _RecordedCall,
    n: int,
    calls: Sequence[_RecordedCall],
    *,
    nvcc: Nvcc | None,
    work: Path,
    arch: str,
    py_lines: list[str],
    display: str,
    notes: list[str],
) -> UnitPlan:
    """The compiler commands that check one recorded extension. A solution's includes and load()
    source files are never read on the host: the sandbox sees only what is written here."""
    same_name = [c for c in calls if c.name == call.name]
    name = call.name if len(same_name) == 1 else f"{call.name}#{n}"
    extension = safe_identifier(call.name)
    nvcc_flags = choose_nvcc_flags(call.extra_cuda_cflags, work)
    host_flags = choose_host_flags(call.extra_cflags, work)
    for label, dropped in (("extra_cuda_cflags", nvcc_flags.dropped), ("extra_cflags", host_flags.dropped)):
        if dropped:
            notes.append(f"extension {name}: {label} not used here: {' '.join(dropped)}")
    include_dirs = [os.path.normpath(work / p) for p in call.extra_include_paths]
    stand_ins = stand_in_dir(work, nvcc) if nvcc else None
    host = host_compiler()
    if call.api == "load_inline":
        cuda_files, cpp_files, known = _inline_sources(call, name, work, py_lines, display)
    else:
        cuda_files, cpp_files, known = [], [], []
        notes.append(
            f"extension {name}: load() builds source files, which a solution run as one file does not "
            "have; pass the sources to load_inline as strings"
        )
    if cuda_files and nvcc is None:
        raise CompileError("nvcc was not found on PATH; install the CUDA toolkit or set PKB_NVCC")
    commands: list[Command] = []
    for k, (source_file, shown, mapping) in enumerate(cuda_files):
        assert nvcc is not None
        argv = nvcc_argv(
            nvcc,
            source=source_file,
            out=work / f"cuda{k}.cubin",
            arch=arch,
            std=None if nvcc_flags.user_std else EXTENSION_STD,
            extension=extension,
            stand_ins=stand_ins,
            include_dirs=include_dirs,
            extra=nvcc_flags.kept,
        )
        material = command_material("nvcc", argv, work, source_file, {})
        commands.append(Command("nvcc", argv, material, mapping, {str(source_file): shown}))
    if cpp_files and host is None:
        notes.append(
            f"extension {name}: no C++ compiler (c++, g++, clang++) on PATH; cpp sources not checked"
        )
    elif host is not None:
        for source_file, shown, mapping in cpp_files:
            argv = cxx_argv(
                host[0],
                nvcc,
                source=source_file,
                std=None if host_flags.user_std else EXTENSION_STD,
                extension=extension,
                stand_ins=stand_ins,
                include_dirs=include_dirs,
                extra=host_flags.kept,
            )
            material = command_material("c++", argv, work, source_file, {})
            paths = {str(source_file): shown}
            commands.append(Command("c++", argv, material, mapping, paths, header=_check_header(call)))
    if not commands and not known:
        where = f"{display}:{call.line}" if call.line else display
        notes.append(f"extension {name} ({where}) has no sources to build")
    toolchain = toolchain_fingerprint(nvcc)
    return UnitPlan(
        name=name, commands=commands, work=work, toolchain=toolchain, inputs={}, diagnostics=known
    )
