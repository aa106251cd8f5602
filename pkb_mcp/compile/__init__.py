"""Build CUDA code for a Hopper target with nvcc on a machine that has nvcc and no GPU.

This is the work behind the `compile_kernel` tool and `pkb compile FILE`: it takes a `.cu`/`.cuh` file or a
candidate solution (`.py`) and returns a `CompileResult` with compiler diagnostics (file, line, severity),
the per-kernel resources that ptxas reports (registers, shared memory, stack frame, spills, barriers), the
build time and whether the result came from the cache.

- A `.cu`/`.cuh` file is compiled with nvcc for one architecture (sm_90a by default) with the flags that
  torch's extension builds use, against torch's and Python's headers, so sources that include
  `<torch/extension.h>` or `<ATen/...>` build as they would under `load_inline`.
- A `.py` solution is never executed on the host. A discovery launch in the sandbox (harness/discover.py)
  imports it with recorders in place of `load_inline` and `load`, and finds the calls that run lazily on
  solution()'s first call; what it reports is parsed as untrusted data. Each recorded extension is then
  built: its CUDA sources with nvcc, its C++ sources with a syntax-only host compiler check. Diagnostics in
  inline source strings are mapped back to lines of the `.py` file. Where the node can build the
  extension itself (pkb_mcp/compile/extensions.py), the same build launch puts it in the extension cache, so a
  check that follows does not build it again.
- Every compiler runs in a build launch in the sandbox (harness/build.py); the host plans the commands
  (flags from an allow-list, sources written as text into the launch directory) and parses their output.
- Results are cached by content (source text, flags, architecture, toolchain versions) under `cache_dir`:
  whole results, and for solutions each compiler run as well, so a solution whose CUDA string changed still
  reuses its C++ check. Failed builds are cached too; timed-out ones are not.

Sandbox launches are run through a `ToolRunner` (pkb_mcp.launches.ToolLaunches): the caller chooses the
backend.

The package offers `compile_file`, `compile_source`, the result models and the output parsers here, and the
node's extension cache in `pkb_mcp.compile.extensions` (`prepare` before a run). Its modules, each of
which imports only modules listed above it:

- `results`: what a build reports (pydantic models), `CompileError`;
- `parse`: compiler output into diagnostics and per-kernel resources;
- `flags`: the allow-list for a solution's compiler flags;
- `toolchain`: nvcc, the host compiler, torch's headers, the command lines, the toolchain fingerprint;
- `cache`: results kept by content;
- `extensions`: discovery and build launches, and the extension cache they fill;
- `units`: one unit's compiler runs, in a build launch or from the cache, and their diagnostics;
- `failures`: a failed extension build as a run reports it, leading with the compiler's first errors
  (`parse.first_errors`) at the solution's lines;
- `cuda_file` and `solution`: the two kinds of input, each built from units.

May import the standard library, pydantic, torch (for its header locations), harness.extensions,
sandbox.toolchain and pkb_mcp's root modules (config, log, models, launches); nothing else of pkb_mcp.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from pkb_mcp.compile.cache import Cache
from pkb_mcp.compile.cuda_file import compile_cuda_file
from pkb_mcp.compile.extensions import ToolRunner
from pkb_mcp.compile.flags import prebuild_refusal
from pkb_mcp.compile.parse import parse_diagnostics, parse_ptxas_resources
from pkb_mcp.compile.results import CompileError, CompileResult, CompileUnit, Diagnostic, KernelResources
from pkb_mcp.compile.solution import compile_solution

__all__ = [
    "CompileError",
    "CompileResult",
    "CompileUnit",
    "Diagnostic",
    "KernelResources",
    "ToolRunner",
    "compile_file",
    "compile_source",
    "parse_diagnostics",
    "parse_ptxas_resources",
    "prebuild_refusal",
]


_CUDA_SUFFIXES = (".cu", ".cuh")


def compile_file(
    path: Path, *, cache_dir: Path, tools: ToolRunner, arch: str = "sm_90a", timeout_s: float = 300
) -> CompileResult:
    """Build a `.cu`/`.cuh` file or the CUDA extensions of a `.py` solution file."""
    path = Path(path)
    suffix = _kind_of(path.name)
    if not path.is_file():
        raise CompileError(
            f"{path} does not exist or is not a file; pass the path of a .cu, .cuh or .py file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CompileError(f"{path} is not UTF-8 text ({exc.reason}); save the file as UTF-8") from exc
    return _compile(
        text,
        path=path.resolve(),
        display=str(path),
        suffix=suffix,
        cache_dir=cache_dir,
        tools=tools,
        arch=arch,
        timeout_s=timeout_s,
    )


def compile_source(
    source: str,
    *,
    filename: str,
    cache_dir: Path,
    tools: ToolRunner,
    arch: str = "sm_90a",
    timeout_s: float = 300,
) -> CompileResult:
    """Build source text; `filename` (`x.cu`, `x.cuh` or `x.py`) decides the kind and names it in messages."""
    suffix = _kind_of(filename)
    name = Path(filename).name
    with tempfile.TemporaryDirectory(prefix="pkb-src-") as tmp:
        path = Path(tmp) / name
        path.write_text(source, encoding="utf-8")
        return _compile(
            source,
            path=path,
            display=filename,
            suffix=suffix,
            cache_dir=cache_dir,
            tools=tools,
            arch=arch,
            timeout_s=timeout_s,
        )


def _kind_of(filename: str) -> str:
    suffix = Path(filename).suffix
    if not Path(filename).name or suffix not in (*_CUDA_SUFFIXES, ".py"):
        raise CompileError(
            f"{filename!r} has an unsupported extension; pass a .cu or .cuh file (CUDA) or a .py solution"
        )
    return suffix


def _compile(
    text: str,
    *,
    path: Path,
    display: str,
    suffix: str,
    cache_dir: Path,
    tools: ToolRunner,
    arch: str,
    timeout_s: float,
) -> CompileResult:
    if not text.strip():
        raise CompileError(f"{display} is empty; pass CUDA source or a solution that defines solution()")
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise CompileError(f"arch {arch!r} is not a GPU architecture name; use one like sm_90a")
    if timeout_s <= 0:
        raise CompileError(f"timeout_s must be positive, got {timeout_s}; pass a number of seconds")
    cache = Cache(Path(cache_dir))
    deadline = time.monotonic() + timeout_s
    if suffix == ".py":
        return compile_solution(
            text, display=display, arch=arch, cache=cache, tools=tools, deadline=deadline, timeout_s=timeout_s
        )
    return compile_cuda_file(
        text,
        path=path,
        display=display,
        arch=arch,
        cache=cache,
        tools=tools,
        deadline=deadline,
        timeout_s=timeout_s,
    )
