"""Build CUDA code for a Hopper target with nvcc on a machine that has nvcc and no GPU.

This is the work behind the `compile_kernel` tool and `pkb compile FILE`: it takes a `.cu`/`.cuh` file or a
candidate solution (`.py`) and returns a `CompileResult` with compiler diagnostics (file, line, severity),
the per-kernel resources that ptxas reports (registers, shared memory, stack frame, spills, barriers), the
build time and whether the result came from the cache.

- A `.cu`/`.cuh` file is compiled with nvcc for one architecture (sm_90a by default) with the flags that
  torch's extension builds use, against torch's and Python's headers, so sources that include
  `<torch/extension.h>` or `<ATen/...>` build as they would under `load_inline`.
- A `.py` solution is never executed on the host. A discovery job in the sandbox (harness/discover.py)
  imports it with recorders in place of `load_inline` and `load`, and finds the calls that run lazily on
  solution()'s first call; what it reports is parsed as untrusted data. Each recorded extension is then
  built: its CUDA sources with nvcc, its C++ sources with a syntax-only host compiler check. Diagnostics in
  inline source strings are mapped back to lines of the `.py` file. Where the node can build the
  extension itself (pkb_mcp/extensions.py), the same build job puts it in the extension cache, so a
  check that follows does not build it again.
- Every compiler runs in a build job in the sandbox (harness/build.py); the host plans the commands
  (flags from an allow-list, sources written as text into the job directory) and parses their output.
- Results are cached by content (source text, flags, architecture, toolchain versions) under `cache_dir`:
  whole results, and for solutions each compiler run as well, so a solution whose CUDA string changed still
  reuses its C++ check. Failed builds are cached too; timed-out ones are not.

Sandbox jobs are run through a `Tools` object (pkb_mcp.jobs.ToolJobs): the caller chooses the backend.
May import the standard library, pydantic, torch (for its header locations) and, for the jobs,
pkb_mcp.extensions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

__all__ = [
    "CompileError",
    "CompileResult",
    "CompileUnit",
    "Diagnostic",
    "KernelResources",
    "compile_file",
    "compile_source",
    "parse_diagnostics",
    "parse_ptxas_resources",
]

# Bump when the parser or the flags change, so old cache entries stop matching.
_CACHE_SCHEMA = 1
_LOG_LIMIT = 4096
_MAX_DIAGNOSTICS_PER_UNIT = 50
_MAX_CAPTURED_OUTPUT = 1 << 20
_MAX_DEPENDENCIES = 256
_DEFAULT_NVCC = (
    "/usr/local/cuda/bin/nvcc"  # where nvcc is looked for when PKB_NVCC is unset and PATH lacks it
)
_CUDA_SUFFIXES = (".cu", ".cuh")
_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")

# torch's extension builds (torch.utils.cpp_extension) pass these to nvcc; mirroring them makes a kernel
# that builds here build under load_inline, and reject what load_inline rejects (e.g. __half operators).
_TORCH_NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-DTORCH_API_INCLUDE_EXTENSION_H",
)
# A standalone .cu follows the tool's contract (C++17); solution extensions follow what load_inline of the
# installed torch (2.13) passes, which is C++20.
_CU_STD = "c++17"
_EXTENSION_STD = "c++20"

# load_inline prepends these lines to the sources it writes (unless no_implicit_headers=True).
_INLINE_CUDA_PREFIX = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
_INLINE_CPP_PREFIX = ("#include <torch/extension.h>",)

# ATen/cuda headers include the CUDA math libraries' headers for handle types. A toolkit without those
# libraries (as on the development machines) gets these declarations instead, searched after every real
# include directory (-idirafter), so a real header always wins.
_LIBRARY_STAND_INS: dict[str, str] = {
    "cusparse.h": (
        "typedef struct cusparseContext* cusparseHandle_t;\n"
        "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n"
        "const char* cusparseGetErrorString(cusparseStatus_t status);\n"
    ),
    "cublas_v2.h": (
        "typedef struct cublasContext* cublasHandle_t;\n"
        "typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n"
    ),
    "cublasLt.h": "#include <cublas_v2.h>\ntypedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolver_common.h": "typedef enum { CUSOLVER_STATUS_SUCCESS = 0 } cusolverStatus_t;\n",
    "cusolverDn.h": "#include <cusolver_common.h>\ntypedef struct cusolverDnContext* cusolverDnHandle_t;\n",
}
_LIBRARY_HEADER_USE = re.compile(r"ATen/cuda/|c10/cuda/|cublas|cusparse|cusolver")

Severity = Literal["error", "warning"]
_Model = TypeVar("_Model", bound=BaseModel)


class CompileError(ValueError):
    """Bad input or a missing toolchain: one sentence that says what to fix."""


class Diagnostic(BaseModel):
    """One compiler (or import) message."""

    file: str | None = Field(description="file the message points at; None for tool-level messages")
    line: int | None = Field(default=None, description="1-based line in `file`")
    column: int | None = Field(default=None, description="1-based column, when the compiler gives one")
    severity: Severity
    message: str
    code: str | None = Field(default=None, description="compiler's id for the message, e.g. 177-D")
    tool: str = Field(description="what produced it: nvcc, ptxas, c++, python or pkb")

    def location(self) -> str:
        if self.file is None:
            return self.tool
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def one_line(self) -> str:
        code = f" [{self.code}]" if self.code else ""
        first = (self.message.splitlines() or [""])[0]
        return f"{self.location()}: {self.severity}{code}: {first}"


def _tool_message(message: str, *, severity: Severity = "error", tool: str = "pkb") -> Diagnostic:
    """A message about the build itself rather than a line of source."""
    return Diagnostic(file=None, severity=severity, message=message, tool=tool)


class KernelResources(BaseModel):
    """Resources of one kernel (entry function) as reported by `ptxas -v` for one architecture."""

    kernel: str = Field(description="demangled name (the mangled one where c++filt is unavailable)")
    mangled: str = Field(description="symbol name as ptxas reports it")
    arch: str
    registers: int = Field(description="registers per thread")
    shared_bytes: int = Field(description="static shared memory per block, bytes (dynamic smem excluded)")
    constant_bytes: int | None = Field(
        default=None, description="constant memory over all banks, bytes; None when ptxas does not report it"
    )
    stack_frame_bytes: int = Field(description="per-thread stack frame (local memory), bytes")
    spill_store_bytes: int = Field(description="bytes of register spill stores per thread")
    spill_load_bytes: int = Field(description="bytes of register spill loads per thread")
    barriers: int = Field(description="named barriers used")
    cumulative_stack_bytes: int | None = Field(
        default=None, description="stack including callees, bytes, when ptxas reports it"
    )


class CompileUnit(BaseModel):
    """One build: a .cu file, or one extension of a solution (its CUDA and C++ sources)."""

    name: str
    ok: bool
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    kernels: list[KernelResources] = Field(default_factory=list)
    build_time_s: float = Field(description="wall time of the original build (also on a cache hit)")
    cache_hit: bool = False
    command: str = Field(description="compiler command lines, one per line; <build> is the temp build dir")
    log: str = Field(default="", description=f"first {_LOG_LIMIT} characters of raw compiler output")


class CompileResult(BaseModel):
    """What `compile_kernel` returns."""

    ok: bool = Field(description="no error anywhere (an empty solution counts as ok)")
    kind: Literal["cuda", "solution"]
    source: str = Field(description="the file as the caller named it")
    arch: str
    units: list[CompileUnit] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(
        default_factory=list, description="file-level messages, e.g. a SyntaxError in a solution"
    )
    build_time_s: float = Field(description="wall time of the whole original build")
    cache_hit: bool = Field(description="every unit (or the whole result) came from the cache")
    notes: list[str] = Field(default_factory=list)
    sandbox: str = Field(
        "", description="the sandbox backend its jobs ran in (docker isolates; process does not)"
    )

    def all_diagnostics(self) -> list[Diagnostic]:
        return [*self.diagnostics, *(d for unit in self.units for d in unit.diagnostics)]

    def errors(self) -> list[Diagnostic]:
        return [d for d in self.all_diagnostics() if d.severity == "error"]

    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.all_diagnostics() if d.severity == "warning"]

    def summary(self, max_messages: int = 15) -> str:
        """Compact text: verdict, errors with file:line, warnings, kernel resource table, notes."""
        errors, warnings = self.errors(), self.warnings()
        verdict = "ok" if self.ok else "FAILED"
        hit = ", cache hit" if self.cache_hit else ""
        lines = [
            f"{self.source} [{self.kind}, {self.arch}]: {verdict}: {_count(len(errors), 'error')}, "
            f"{_count(len(warnings), 'warning')}; {len(self.units)} unit(s); {self.build_time_s:.1f} s{hit}"
        ]
        for title, group in (("errors", errors), ("warnings", warnings)):
            if not group:
                continue
            lines.append(f"{title}:")
            for d in group[:max_messages]:
                lines.append(f"  {d.one_line()}")
                if d.severity == "error":  # context such as a trimmed traceback or a template instantiation
                    lines.extend(f"      {extra}" for extra in d.message.splitlines()[1:4])
            if len(group) > max_messages:
                lines.append(f"  ... and {len(group) - max_messages} more")
        kernels = [(unit.name, k) for unit in self.units for k in unit.kernels]
        if kernels:
            lines.append("kernels (ptxas; bytes per thread for stack/spills, per block for smem):")
            lines.extend(f"  {row}" for row in _kernel_table(kernels))
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  - {note}" for note in self.notes)
        return "\n".join(lines)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _kernel_table(kernels: Sequence[tuple[str, KernelResources]]) -> list[str]:
    header = ("unit", "kernel", "regs", "smem", "cmem", "stack", "spill st", "spill ld", "barriers")
    rows = [header]
    for unit, k in kernels:
        name = k.kernel if len(k.kernel) <= 60 else k.kernel[:57] + "..."
        cmem = "-" if k.constant_bytes is None else str(k.constant_bytes)
        rows.append(
            (
                unit,
                name,
                str(k.registers),
                str(k.shared_bytes),
                cmem,
                str(k.stack_frame_bytes),
                str(k.spill_store_bytes),
                str(k.spill_load_bytes),
                str(k.barriers),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return out


# --------------------------------------------------------------------------------------------------------
# Public entry points


class Tools(Protocol):
    """Runs harness tool programs as sandbox jobs (pkb_mcp.jobs.ToolJobs)."""

    isolated: bool

    def new_dir(self) -> Path: ...

    def run(self, mode: str, job_dir: Path, params: dict[str, Any], timeout_s: float) -> Any: ...


def compile_file(
    path: Path, *, cache_dir: Path, tools: Tools, arch: str = "sm_90a", timeout_s: float = 300
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
    source: str, *, filename: str, cache_dir: Path, tools: Tools, arch: str = "sm_90a", timeout_s: float = 300
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
    tools: Tools,
    arch: str,
    timeout_s: float,
) -> CompileResult:
    if not text.strip():
        raise CompileError(f"{display} is empty; pass CUDA source or a solution that defines solution()")
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise CompileError(f"arch {arch!r} is not a GPU architecture name; use one like sm_90a")
    if timeout_s <= 0:
        raise CompileError(f"timeout_s must be positive, got {timeout_s}; pass a number of seconds")
    cache = _Cache(Path(cache_dir))
    deadline = time.monotonic() + timeout_s
    if suffix == ".py":
        return _compile_solution(
            text, display=display, arch=arch, cache=cache, tools=tools, deadline=deadline, timeout_s=timeout_s
        )
    return _compile_cuda_file(
        text,
        path=path,
        display=display,
        arch=arch,
        cache=cache,
        tools=tools,
        deadline=deadline,
        timeout_s=timeout_s,
    )


# --------------------------------------------------------------------------------------------------------
# Toolchain discovery


@dataclass(frozen=True)
class _Nvcc:
    path: str
    version: str
    include_dirs: tuple[str, ...]


@dataclass(frozen=True)
class _TorchHeaders:
    include_dirs: tuple[str, ...]
    python_include: str
    torch_version: str
    has_cuda_cmake_macros: bool


def _find_nvcc() -> _Nvcc:
    configured = os.environ.get("PKB_NVCC")
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise CompileError(
                f"PKB_NVCC={configured} is not an executable file; point it at nvcc or unset it"
            )
        return _nvcc_info(os.path.realpath(configured))
    found = shutil.which("nvcc")
    if found is None and os.access(_DEFAULT_NVCC, os.X_OK):
        found = _DEFAULT_NVCC
    if found is None:
        raise CompileError("nvcc was not found on PATH; install the CUDA toolkit or set PKB_NVCC")
    # by its real path: /usr/local/cuda is often a link through /etc/alternatives, which the sandbox lacks
    return _nvcc_info(os.path.realpath(found))


@functools.cache
def _nvcc_info(nvcc: str) -> _Nvcc:
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True)
        # The dry run shows where nvcc itself looks for headers (INCLUDES in nvcc.profile).
        dry = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-cubin", "-o", os.devnull, os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompileError(
            f"running {nvcc} --version failed ({exc}); check the CUDA installation or PKB_NVCC"
        ) from exc
    dirs: list[str] = []
    for line in dry.stderr.splitlines() + dry.stdout.splitlines():
        if "INCLUDES=" in line:
            for token in shlex.split(line.split("=", 1)[1]):
                if token.startswith("-I") and len(token) > 2:
                    dirs.append(os.path.normpath(token[2:]))
                elif token != "-isystem" and os.path.isabs(token):
                    dirs.append(os.path.normpath(token))
    return _Nvcc(path=nvcc, version=version.stdout.strip(), include_dirs=tuple(dict.fromkeys(dirs)))


@functools.cache
def _torch_headers() -> _TorchHeaders:
    import torch
    from torch.utils.cpp_extension import include_paths

    dirs = tuple(include_paths())
    python_include = sysconfig.get_path("include", scheme="posix_prefix") or sysconfig.get_path("include")
    has_macros = any(os.path.isfile(os.path.join(d, "c10/cuda/impl/cuda_cmake_macros.h")) for d in dirs)
    return _TorchHeaders(dirs, python_include, str(torch.__version__), has_macros)


@functools.cache
def _host_compiler() -> tuple[str, str] | None:
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            found = os.path.realpath(found)  # the sandbox has no /etc/alternatives to follow
            try:
                out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            return found, (out.stdout.splitlines() or [""])[0]
    return None


def _missing_library_headers(nvcc: _Nvcc) -> list[str]:
    return [
        name
        for name in _LIBRARY_STAND_INS
        if not any(os.path.isfile(os.path.join(d, name)) for d in nvcc.include_dirs)
    ]


def _stand_in_dir(root: Path, nvcc: _Nvcc) -> Path | None:
    """Write stand-ins for the library headers this toolkit lacks; None when it has them all."""
    if not _missing_library_headers(nvcc):
        return None
    directory = root / "stand-in-headers"
    directory.mkdir(exist_ok=True)
    for name, body in _LIBRARY_STAND_INS.items():  # all of them, since they include each other
        (directory / name).write_text(f"#pragma once\n// pkb-mcp stand-in: {name} is not installed\n{body}")
    return directory


def _toolchain_fingerprint(nvcc: _Nvcc | None) -> dict[str, str]:
    torch_headers = _torch_headers()
    host = _host_compiler()
    return {
        "schema": str(_CACHE_SCHEMA),
        "nvcc": nvcc.version if nvcc else "absent",
        "nvcc_includes": ":".join(nvcc.include_dirs) if nvcc else "",
        "host": host[1] if host else "absent",
        "torch": torch_headers.torch_version,
        "torch_includes": ":".join(torch_headers.include_dirs),
        "python_include": torch_headers.python_include,
    }


def _optional_nvcc() -> _Nvcc | None:
    try:
        return _find_nvcc()
    except CompileError:
        return None


# --------------------------------------------------------------------------------------------------------
# Cache


def _digest(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _file_digest(path: str) -> str:
    try:
        return _digest(Path(path).read_bytes())
    except OSError:
        return "missing"


class _Cache:
    """JSON files named by the sha256 of what went into a build; `inputs` are files re-checked on a hit."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def key(material: dict[str, object]) -> str:
        return _digest(json.dumps(material, sort_keys=True))

    def load(self, key: str, model: type[_Model]) -> _Model | None:
        try:
            stored = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
            inputs: dict[str, str] = stored["inputs"]
            value = model.model_validate(stored["value"])
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            return None
        if any(_file_digest(p) != digest for p, digest in inputs.items()):
            return None
        return value

    def store(self, key: str, value: BaseModel, inputs: dict[str, str]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            payload = json.dumps({"inputs": inputs, "value": value.model_dump(mode="json")})
            tmp = self.root / f".{key}.{os.getpid()}.{time.monotonic_ns()}.tmp"
            tmp.write_text(payload, encoding="utf-8")
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written only costs time


def _local_dependencies(
    sources: Iterable[tuple[str, Path | None]], include_dirs: Sequence[Path], root: Path | None = None
) -> dict[str, str]:
    """Files the sources include from their own folder or user include dirs: {path: sha256}.

    Only relative names that stay inside `root` count: an include of `/etc/...` or `../..` is never
    read here (the sandbox sees only the copies made of these files)."""
    found: dict[str, str] = {}
    if root is None:
        return found
    top = os.path.realpath(root)
    pending = list(sources)
    pattern = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
    while pending and len(found) < _MAX_DEPENDENCIES:
        text, base = pending.pop()
        for quote, name in pattern.findall(text):
            if os.path.isabs(name):
                continue
            bases = ([base] if quote == '"' and base is not None else []) + list(include_dirs)
            for directory in bases:
                candidate = os.path.normpath(directory / name)
                real = os.path.realpath(candidate)
                if not real.startswith(top + os.sep) or candidate in found or not os.path.isfile(real):
                    continue
                found[candidate] = _file_digest(real)
                pending.append((_read(real), Path(candidate).parent))
                break
    return found


# --------------------------------------------------------------------------------------------------------
# Running compilers: in a build job in the sandbox (harness/build.py)


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.01)


def _execute(
    plans: Sequence[_UnitPlan],
    cache: _Cache,
    tools: Tools,
    work: Path,
    deadline: float,
    prebuild: Sequence[Any] = (),
) -> tuple[list[list[tuple[_JobRecord | None, bool]]], Any]:
    """Each plan's compiler runs: from the cache, or from one build job in `work` (the job directory
    the plans wrote their sources into), which also builds `prebuild` extension requests. Returns per
    plan [(record or None when the job left none, cache hit)], and what the extension builds did."""
    from pkb_mcp import extensions

    keyed = []
    for plan in plans:
        row = []
        for job in plan.jobs:
            key = cache.key({**job.key_material, "toolchain": plan.toolchain}) if job.key_material else ""
            row.append((key, cache.load(key, _JobRecord) if key else None))
        keyed.append(row)
    pending = [(p, j) for p, row in enumerate(keyed) for j, (_, record) in enumerate(row) if record is None]
    commands = [{"argv": plans[p].jobs[j].argv, "cwd": str(plans[p].work)} for p, j in pending]
    prepared, result = extensions.build_requests(
        list(prebuild), tools, _remaining(deadline), extra={"commands": commands}, job_dir=work
    )
    ran = result.get("commands", []) if result is not None else []
    ran = ran if isinstance(ran, list) else []
    out: list[list[tuple[_JobRecord | None, bool]]] = [[(r, r is not None) for _, r in row] for row in keyed]
    for n, (p, j) in enumerate(pending):
        record = _parse_record(ran[n]) if n < len(ran) else None
        if record is not None:  # the job wrote its directory as <build>; a unit's record names its own
            output = record.output.replace("<build>", str(work)).replace(str(plans[p].work), "<build>")
            record = record.model_copy(update={"output": output})
        out[p][j] = (record, False)
        key = keyed[p][j][0]
        finished = record is not None and record.returncode is not None and 0 <= record.returncode != 127
        if key and finished and record is not None:  # timed-out and unstartable runs are not kept
            cache.store(key, record, plans[p].inputs)
    return out, prepared


def _parse_record(value: Any) -> _JobRecord | None:
    """A compiler run as the build job reported it (untrusted: checked, output capped)."""
    try:
        record = _JobRecord.model_validate(value)
    except ValidationError:
        return None
    return record.model_copy(update={"output": record.output[:_MAX_CAPTURED_OUTPUT]})


# --------------------------------------------------------------------------------------------------------
# Output parsing

_EDG_RE = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<sev>catastrophic error|internal error|error|warning)"
    r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$"
)
_GCC_RE = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
    r"(?P<sev>fatal error|error|warning): (?P<msg>.*)$"
)
_TOOL_RE = re.compile(
    r"^(?P<tool>nvcc|ptxas|nvlink|cicc|cudafe\+\+)\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$"
)
_PTXAS_LOC_RE = re.compile(
    r"^ptxas (?P<file>[^,]+), line (?P<line>\d+); (?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$"
)
_ENTRY_RE = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>\w+)'")
_PROPERTIES_RE = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME_RE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (?P<regs>\d+) registers")


def _severity(word: str) -> Severity:
    return "warning" if word == "warning" else "error"


def parse_diagnostics(output: str, *, tool: str) -> list[Diagnostic]:
    """nvcc (EDG front end), gcc-style and tool-level messages in compiler output, duplicates removed."""
    lines = output.splitlines()
    found: list[Diagnostic] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if m := _EDG_RE.match(line):
            block: list[str] = []
            while i < len(lines) and lines[i].strip() and not _is_header(lines[i]):
                block.append(lines[i])
                i += 1
            carets = [n for n, b in enumerate(block) if set(b.strip()) == {"^"}]
            details = block[: carets[0] - 1] + block[carets[0] + 1 :] if carets else block
            message = "\n".join([m["msg"], *(d.strip() for d in details[:6])])
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    severity=_severity(m["sev"]),
                    message=message,
                    code=m["code"],
                    tool=tool,
                )
            )
        elif m := _GCC_RE.match(line):
            message, code = m["msg"], None
            if flag := re.search(r" \[(-W[\w=+-]+)\]$", message):
                message, code = message[: flag.start()], flag.group(1)
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    column=int(m["col"]) if m["col"] else None,
                    severity=_severity(m["sev"]),
                    message=message,
                    code=code,
                    tool=tool,
                )
            )
        elif m := _PTXAS_LOC_RE.match(line):
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    severity=_severity(m["sev"]),
                    message=m["msg"],
                    tool="ptxas",
                )
            )
        elif m := _TOOL_RE.match(line):
            found.append(
                Diagnostic(file=None, severity=_severity(m["sev"]), message=m["msg"].strip(), tool=m["tool"])
            )
    unique = list({(d.file, d.line, d.column, d.severity, d.message): d for d in found}.values())
    return unique


def _is_header(line: str) -> bool:
    return any(r.match(line) for r in (_EDG_RE, _GCC_RE, _TOOL_RE, _PTXAS_LOC_RE)) or line.startswith("ptxas")


def parse_ptxas_resources(output: str) -> list[KernelResources]:
    """Per-kernel resources from `ptxas -v` output (entry functions only, in the order ptxas lists them)."""
    kernels: dict[str, dict[str, int | str | None]] = {}
    current: str | None = None
    properties_of: str | None = None
    for line in output.splitlines():
        if m := _ENTRY_RE.search(line):
            current = m["name"]
            kernels.setdefault(current, {"arch": m["arch"]})
            properties_of = None
        elif m := _PROPERTIES_RE.search(line):
            properties_of = m["name"]
            if current is None:  # older ptxas: properties before (or without) the entry line
                current = properties_of
                kernels.setdefault(current, {"arch": ""})
        elif m := _FRAME_RE.search(line):
            if properties_of is not None and properties_of == current:
                entry = kernels[current]
                entry["stack"], entry["spill_st"], entry["spill_ld"] = (
                    int(m["stack"]),
                    int(m["st"]),
                    int(m["ld"]),
                )
        elif (m := _USED_RE.search(line)) and current is not None:
            entry = kernels[current]
            entry["regs"] = int(m["regs"])
            if b := re.search(r"used (\d+) barriers", line):
                entry["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                entry["smem"] = int(s.group(1))
            cmem = re.findall(r"(\d+) bytes cmem\[\d+\]", line)
            entry["cmem"] = sum(int(c) for c in cmem) if cmem else None
            if c := re.search(r"(\d+) bytes cumulative stack size", line):
                entry["cumulative"] = int(c.group(1))
    result = []
    for name, entry in kernels.items():
        if "regs" not in entry:
            continue

        def number(key: str, entry: dict[str, int | str | None] = entry) -> int:
            value = entry.get(key)
            return value if isinstance(value, int) else 0

        cmem_value, cumulative = entry.get("cmem"), entry.get("cumulative")
        result.append(
            KernelResources(
                kernel=name,
                mangled=name,
                arch=str(entry.get("arch") or ""),
                registers=number("regs"),
                shared_bytes=number("smem"),
                constant_bytes=cmem_value if isinstance(cmem_value, int) else None,
                stack_frame_bytes=number("stack"),
                spill_store_bytes=number("spill_st"),
                spill_load_bytes=number("spill_ld"),
                barriers=number("barriers"),
                cumulative_stack_bytes=cumulative if isinstance(cumulative, int) else None,
            )
        )
    return result


def _demangle(names: Sequence[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {}
    try:
        out = subprocess.run(
            [tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    demangled = out.stdout.splitlines()
    return dict(zip(names, demangled, strict=False)) if len(demangled) == len(names) else {}


# --------------------------------------------------------------------------------------------------------
# Flags the caller passes (extra_cuda_cflags / extra_cflags of a solution): an allow-list, because a flag
# such as -ccbin, --run or -Xcompiler -B would let candidate code choose which program runs here.

# fmt: off
_NVCC_TAKES_VALUE = frozenset((
    "-Xptxas", "--ptxas-options", "-Xcompiler", "--compiler-options", "-Xcudafe", "-maxrregcount",
    "--maxrregcount", "-I", "--include-path", "-isystem", "-D", "--define-macro", "-U", "--undefine-macro",
    "-diag-suppress", "--diag-suppress", "--default-stream", "-default-stream", "-rdc",
    "--relocatable-device-code", "-std", "--std", "-arch", "--gpu-architecture", "-gencode",
    "--generate-code", "-code", "--gpu-code", "-o", "--output-file", "-ccbin", "--compiler-bindir", "-x",
    "--x", "-include", "--pre-include", "-Xlinker", "--linker-options", "-Xnvlink", "-Xarchive", "-odir",
    "--run-args", "-ftz", "--ftz", "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad",
    "--fmad",
))
_NVCC_SWITCHES = frozenset((
    "-use_fast_math", "--use_fast_math", "-lineinfo", "--generate-line-info", "-G", "--device-debug", "-g",
    "--debug", "--expt-relaxed-constexpr", "-expt-relaxed-constexpr", "--expt-extended-lambda",
    "-expt-extended-lambda", "--extended-lambda", "-extended-lambda", "-w", "--disable-warnings",
    "-restrict", "--restrict", "-Wno-deprecated-gpu-targets", "-Wno-deprecated-declarations",
    "-Werror=all-warnings", "--resource-usage", "-res-usage", "-v",
))
_NVCC_VALUED_OK = frozenset((
    "-Xptxas", "--ptxas-options", "-Xcudafe", "-maxrregcount", "--maxrregcount", "-diag-suppress",
    "--diag-suppress", "--default-stream", "-default-stream", "-rdc", "--relocatable-device-code", "-std",
    "--std", "-ftz", "--ftz", "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad",
    "-D", "--define-macro", "-U", "--undefine-macro",
))
_NVCC_PATH_FLAGS = frozenset(("-I", "--include-path", "-isystem", "-include", "--pre-include"))
# fmt: on
# Options forwarded to ptxas / cudafe that only change code generation or messages (no file names).
_PTXAS_ITEM_RE = re.compile(
    r"-{1,2}(v|verbose|O[0-3]|warn-spills|warn-on-spills|warn-lmem-usage|warn-on-local-memory-usage|"
    r"warn-double-usage|w|disable-warnings|Werror|warning-as-error|lineinfo|generate-line-info|"
    r"(dlcm|dscm|def-load-cache|def-store-cache|fmad|maxrregcount|allow-expensive-optimizations)=\w+|"
    r"allow-expensive-optimizations|disable-optimizer-constants|suppress-stack-size-warning)"
)
_CUDAFE_ITEM_RE = re.compile(r"-{1,2}(diag[_-](suppress|warning|error|remark)=[\w,-]+|display_error_number)")
_ARCH_FLAG_RE = re.compile(
    r"(-gencode[= ]arch=compute_\d+[af]?,code=(sm|compute)_\d+[af]?|-arch[= ]sm_\d+[af]?|--use_fast_math)"
)
_HOST_FLAG_RE = re.compile(
    r"-(O[0-3sgz]?|Ofast|W(?!l$|p$|a$|l,|p,|a,)[\w=+-]*|w|D\S+|U\S+|f(?!plugin)[\w=+.-]+|m[\w=.-]+|"
    r"std=[\w+]+|g\d?|pthread|fopenmp|fPIC)"
)


@dataclass
class _FlagChoice:
    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    user_std: bool = False


def _choose_nvcc_flags(flags: Sequence[str], base: Path) -> _FlagChoice:
    choice = _FlagChoice()
    i = 0
    while i < len(flags):
        token = flags[i]
        i += 1
        name, value = token, None
        if token in _NVCC_TAKES_VALUE and i < len(flags):
            value = flags[i]
            i += 1
        elif token[:2] in ("-I", "-D", "-U", "-O") and len(token) > 2:
            name, value = token[:2], token[2:]
        elif token.startswith("-") and "=" in token:
            name, value = token.split("=", 1)
        if name in _NVCC_SWITCHES and value is None:
            choice.kept.append(name)
        elif name == "-O" and value in ("0", "1", "2", "3"):
            choice.kept.append(f"-O{value}")
        elif name in ("-D", "-U") and value:
            choice.kept.append(name + value)
        elif name in ("-Xptxas", "--ptxas-options", "-Xcudafe") and value is not None:
            pattern = _CUDAFE_ITEM_RE if name == "-Xcudafe" else _PTXAS_ITEM_RE
            if all(pattern.fullmatch(item) for item in value.split(",") if item):
                choice.kept += [name, value]
            else:
                choice.dropped.append(f"{name} {value}")
        elif name in _NVCC_VALUED_OK and value is not None and re.fullmatch(r"[\w+.,=-]+", value):
            choice.kept += [name, value]
            choice.user_std |= name in ("-std", "--std")
        elif name in _NVCC_PATH_FLAGS and value is not None:
            choice.kept += [name, str(base / value)]
        elif name in ("-Xcompiler", "--compiler-options") and value is not None:
            items = [item for item in value.split(",") if item]
            if items and all(_HOST_FLAG_RE.fullmatch(item) for item in items):
                choice.kept += [name, value]
            else:
                choice.dropped.append(f"{name} {value}")
        else:
            choice.dropped.append(token if value is None or "=" in token else f"{token} {value}")
    return choice


def _choose_host_flags(flags: Sequence[str], base: Path) -> _FlagChoice:
    choice = _FlagChoice()
    i = 0
    while i < len(flags):
        token = flags[i]
        i += 1
        if token in ("-I", "-isystem", "-include") and i < len(flags):
            choice.kept += [token, str(base / flags[i])]
            i += 1
        elif token.startswith("-I") and len(token) > 2:
            choice.kept.append("-I" + str(base / token[2:]))
        elif _HOST_FLAG_RE.fullmatch(token):
            choice.kept.append(token)
            choice.user_std |= token.startswith("-std=")
        else:
            choice.dropped.append(token)
    return choice


# --------------------------------------------------------------------------------------------------------
# Building one unit


@dataclass
class _LineMap:
    """Maps lines of a file that load_inline would generate back to the user's strings and the .py file."""

    generated: str
    prefix_lines: int
    chunks: list[str]
    py_lines: list[str]
    py_display: str
    pseudo_name: str
    offsets: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = [_locate_chunk(chunk, self.py_lines) for chunk in self.chunks]

    def map(self, line: int) -> tuple[str, int]:
        index = line - self.prefix_lines - 1
        if index < 0:
            return self.pseudo_name, line
        for n, chunk in enumerate(self.chunks):
            count = chunk.count("\n") + 1
            if index < count:
                offset = self.offsets[n]
                if offset is not None:
                    return self.py_display, offset + index + 1
                label = f"{self.pseudo_name}[{n}]" if len(self.chunks) > 1 else self.pseudo_name
                return label, index + 1
            index -= count
        return self.pseudo_name, line


def _locate_chunk(chunk: str, py_lines: Sequence[str]) -> int | None:
    """0-based .py line index of the chunk's first line, or None where the text cannot be found.

    Anchors on the chunk's longest line (its first non-empty line ties), then keeps the placement where the
    most chunk lines equal the .py lines (escapes in a non-raw string may spoil a few lines, not most)."""
    chunk_lines = [line.strip() for line in chunk.split("\n")]
    non_empty = [(n, text) for n, text in enumerate(chunk_lines) if text]
    if not non_empty:
        return None
    anchor_n, anchor = max(non_empty, key=lambda item: (len(item[1]), -item[0]))
    stripped = [line.strip() for line in py_lines]
    best: tuple[int, int] | None = None
    for i, py_line in enumerate(stripped):
        if anchor not in py_line:
            continue
        offset = i - anchor_n
        score = 0
        for n, text in non_empty:
            j = offset + n
            if 0 <= j < len(stripped) and (
                stripped[j] == text or (text in stripped[j] and n in (0, anchor_n))
            ):
                score += 1
        if best is None or score > best[1]:
            best = (offset, score)
    if best is None or best[1] * 2 < len(non_empty):
        return None
    return best[0]


@dataclass
class _Job:
    tool: Literal["nvcc", "c++"]
    argv: list[str]
    key_material: dict[str, object]  # what decides the compiler's output, besides the toolchain
    line_map: _LineMap | None = None
    paths: dict[str, str] = field(default_factory=dict)  # compiler path -> name shown to the user


@dataclass
class _UnitPlan:
    name: str
    jobs: list[_Job]
    work: Path
    toolchain: dict[str, str]
    inputs: dict[str, str] = field(default_factory=dict)  # files read besides the .py: {path: sha256}
    diagnostics: list[Diagnostic] = field(default_factory=list)  # known before building


def _job_material(
    tool: str, argv: Sequence[str], work: Path, source: Path, deps: dict[str, str]
) -> dict[str, object]:
    return {
        "level": "job",
        "tool": tool,
        "argv": _shown(argv, work),
        "source": _read(str(source)),
        "deps": deps,
    }


def _nvcc_argv(
    nvcc: _Nvcc,
    *,
    source: Path,
    out: Path,
    arch: str,
    std: str | None,
    extension: str,
    stand_ins: Path | None,
    include_dirs: Sequence[str],
    extra: Sequence[str],
) -> list[str]:
    torch_headers = _torch_headers()
    argv = [
        nvcc.path,
        "-x",
        "cu",
        "-gencode",
        f"arch=compute_{arch[3:]},code={arch}",
        "-cubin",
        "-o",
        str(out),
    ]
    if std:
        argv.append(f"-std={std}")
    argv += ["-O3", "-lineinfo", "-Xptxas", "-v", "-Xptxas", "-warn-spills", *_TORCH_NVCC_DEFINES]
    argv.append(f"-DTORCH_EXTENSION_NAME={extension}")
    if not torch_headers.has_cuda_cmake_macros:
        # CPU wheels lack this generated header; c10/cuda/CUDAMacros.h offers this switch to skip it.
        argv.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    for d in include_dirs:
        argv += ["-I", d]
    for d in (*torch_headers.include_dirs, torch_headers.python_include):
        argv += ["-isystem", d]
    if stand_ins is not None:
        argv += ["-Xcompiler", f"-idirafter,{stand_ins}"]
    return [*argv, *extra, str(source)]


def _cxx_argv(
    cxx: str,
    nvcc: _Nvcc | None,
    *,
    source: Path,
    std: str | None,
    extension: str,
    stand_ins: Path | None,
    include_dirs: Sequence[str],
    extra: Sequence[str],
) -> list[str]:
    torch_headers = _torch_headers()
    argv = [cxx, "-fsyntax-only", "-x", "c++"]
    if std:
        argv.append(f"-std={std}")
    argv += [f"-DTORCH_EXTENSION_NAME={extension}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    if not torch_headers.has_cuda_cmake_macros:
        argv.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    for d in include_dirs:
        argv += ["-I", d]
    system = [*torch_headers.include_dirs, torch_headers.python_include, *(nvcc.include_dirs if nvcc else ())]
    for d in system:
        argv += ["-isystem", d]
    if stand_ins is not None:
        argv += ["-idirafter", str(stand_ins)]
    return [*argv, *extra, str(source)]


def _shown(argv: Sequence[str], work: Path) -> str:
    return shlex.join(argv).replace(str(work), "<build>")


class _JobRecord(BaseModel):
    """A compiler run as cached: its exit status and output, with the build dir written as <build>."""

    returncode: int | None
    output: str
    elapsed_s: float


def _unit_result(
    plan: _UnitPlan, ran: Sequence[tuple[_JobRecord | None, bool]], timeout_s: float
) -> CompileUnit:
    """A unit's diagnostics and kernel resources from the output of each of its compiler runs."""
    work = plan.work
    lost = _JobRecord(returncode=None, output="", elapsed_s=0.0)
    records = [record if record is not None else lost for record, _ in ran]
    hits = [hit for _, hit in ran]
    diagnostics = list(plan.diagnostics)
    kernels: list[KernelResources] = []
    logs: list[str] = []
    for job, record in zip(plan.jobs, records, strict=True):
        logs.append(f"$ {_shown(job.argv, work)}\n{record.output}")
        output = record.output.replace("<build>", str(work))
        found = [_place(d, job, work) for d in parse_diagnostics(output, tool=job.tool)]
        if record.returncode is None:
            found.append(_tool_message(f"build timed out after {timeout_s:g} s ({job.tool} was killed)"))
        elif record.returncode < 0 or record.returncode == 127:
            found.append(_tool_message(f"{job.tool} failed to run (status {record.returncode}); see log"))
        elif record.returncode != 0 and not any(d.severity == "error" for d in found):
            found.append(
                _tool_message(f"{job.tool} exited with status {record.returncode}; see log", tool=job.tool)
            )
        diagnostics += found
        if job.tool == "nvcc":
            kernels += parse_ptxas_resources(output)
    names = _demangle([k.mangled for k in kernels])
    kernels = [k.model_copy(update={"kernel": names.get(k.mangled, k.mangled)}) for k in kernels]
    diagnostics = _dedupe(diagnostics)
    diagnostics.sort(key=lambda d: d.severity != "error")  # stable: errors first, compiler order kept
    if len(diagnostics) > _MAX_DIAGNOSTICS_PER_UNIT:
        omitted = len(diagnostics) - _MAX_DIAGNOSTICS_PER_UNIT
        diagnostics = diagnostics[:_MAX_DIAGNOSTICS_PER_UNIT]
        diagnostics.append(
            _tool_message(f"{omitted} more diagnostics omitted; see the log", severity="warning")
        )
    return CompileUnit(
        name=plan.name,
        ok=not any(d.severity == "error" for d in diagnostics),
        diagnostics=diagnostics,
        kernels=kernels,
        # jobs run side by side, so the unit took as long as its slowest job
        build_time_s=max((r.elapsed_s for r in records), default=0.0),
        cache_hit=bool(plan.jobs) and all(hits),
        command="\n".join(_shown(job.argv, work) for job in plan.jobs),
        log="\n".join(logs)[:_LOG_LIMIT],
    )


def _dedupe(diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
    return list({(d.file, d.line, d.column, d.severity, d.message): d for d in diagnostics}.values())


def _place(diagnostic: Diagnostic, job: _Job, work: Path) -> Diagnostic:
    """Rewrite a compiler's file name to what the user knows: the .py line, or the file's given name."""
    if diagnostic.file is None:
        return diagnostic
    path = os.path.normpath(os.path.join(work, diagnostic.file))
    if job.line_map is not None and path == job.line_map.generated and diagnostic.line is not None:
        file, line = job.line_map.map(diagnostic.line)
        column = diagnostic.column if file != job.line_map.py_display else None
        return diagnostic.model_copy(update={"file": file, "line": line, "column": column})
    if path in job.paths:
        return diagnostic.model_copy(update={"file": job.paths[path]})
    return diagnostic.model_copy(update={"file": diagnostic.file.replace(str(work), "<build>")})


def _safe_identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name) or "extension"
    return f"_{ident}" if ident[0].isdigit() else ident


# --------------------------------------------------------------------------------------------------------
# .cu / .cuh


def _cached_result(cache: _Cache, key: str) -> CompileResult | None:
    """A stored result, marked (with each of its units) as a cache hit; None when not stored."""
    cached = cache.load(key, CompileResult)
    if cached is None:
        return None
    units = [u.model_copy(update={"cache_hit": True}) for u in cached.units]
    return cached.model_copy(update={"cache_hit": True, "units": units})


def _compile_cuda_file(
    text: str,
    *,
    path: Path,
    display: str,
    arch: str,
    cache: _Cache,
    tools: Tools,
    deadline: float,
    timeout_s: float,
) -> CompileResult:
    nvcc = _find_nvcc()
    start = time.monotonic()
    deps = _local_dependencies([(text, path.parent)], [], root=path.parent)
    material: dict[str, object] = {
        "level": "cuda-file",
        "arch": arch,
        "display": display,
        "source": text,
        "deps": deps,
        "toolchain": _toolchain_fingerprint(nvcc),
    }
    key = cache.key(material)
    cached = _cached_result(cache, key)
    if cached is not None:
        return cached
    work = tools.new_dir()
    try:
        # the sandbox sees copies: the file, and the headers it includes from its own folder
        src = work / "src"
        source = src / path.name
        src.mkdir()
        source.write_text(text, encoding="utf-8")
        for dep in deps:
            relative = Path(dep).relative_to(path.parent)
            (src / relative).parent.mkdir(parents=True, exist_ok=True)
            (src / relative).write_text(_read(dep), encoding="utf-8")
        stand_ins = _stand_in_dir(work, nvcc)
        argv = _nvcc_argv(
            nvcc,
            source=source,
            out=work / "out.cubin",
            arch=arch,
            std=_CU_STD,
            extension=_safe_identifier(path.stem),
            stand_ins=stand_ins,
            include_dirs=[],
            extra=[],
        )
        paths = {str(source): display, **{str(src / Path(d).relative_to(path.parent)): d for d in deps}}
        # The whole result is cached below; a job-level entry would duplicate it (no key material).
        job = _Job("nvcc", argv, key_material={}, paths=paths)
        plan = _UnitPlan(name=Path(display).name, jobs=[job], work=work, toolchain={}, inputs=deps)
        ran, _ = _execute([plan], cache, tools, work, deadline)
        unit = _unit_result(plan, ran[0], timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes = [
        "compiled with nvcc -cubin: host code is checked by the CUDA front end, not compiled by the host "
        "compiler; no object file is produced"
    ]
    notes += _stand_in_notes(_missing_library_headers(nvcc), [text, *(_read(p) for p in deps)])
    result = CompileResult(
        ok=unit.ok,
        kind="cuda",
        source=display,
        arch=arch,
        units=[unit],
        build_time_s=round(time.monotonic() - start, 3),
        cache_hit=False,
        notes=notes,
    )
    if not any(d.tool == "pkb" and d.severity == "error" for d in unit.diagnostics):
        cache.store(key, result, deps)
    return result


class _NoCache(_Cache):
    def __init__(self) -> None:
        super().__init__(Path(os.devnull))

    def load(self, key: str, model: type[_Model]) -> _Model | None:
        return None

    def store(self, key: str, value: BaseModel, inputs: dict[str, str]) -> None:
        return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _stand_in_notes(missing: Sequence[str], texts: Iterable[str]) -> list[str]:
    if missing and any(_LIBRARY_HEADER_USE.search(t) for t in texts):
        return [
            f"this CUDA toolkit lacks {', '.join(missing)}; stand-in declarations of their handle types let "
            "ATen/cuda headers parse, so calls into those libraries cannot be checked here"
        ]
    return []


# --------------------------------------------------------------------------------------------------------
# .py solutions


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


def _record_extensions(text: str, tools: Tools, deadline: float, timeout_s: float) -> _Recording | Diagnostic:
    """The solution's builder calls, from a discovery job in the sandbox (kept per solution text)."""
    from pkb_mcp import extensions

    found = extensions.discover(text, tools, _remaining(deadline))
    if isinstance(found, str):
        if found.startswith(extensions.TIMED_OUT):
            return _tool_message(
                f"build timed out after {timeout_s:g} s while importing the solution "
                "(module-level code must finish quickly)"
            )
        return _tool_message(found, tool="python")
    try:
        return _Recording.model_validate(found)
    except ValidationError:
        return _tool_message("the discovery job returned malformed data; the solution was not checked")


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


def _compile_solution(
    text: str, *, display: str, arch: str, cache: _Cache, tools: Tools, deadline: float, timeout_s: float
) -> CompileResult:
    start = time.monotonic()
    try:  # compiling does not run anything; it finds syntax errors without a subprocess
        compile(text, display, "exec", dont_inherit=True)
    except SyntaxError as exc:
        diagnostic = Diagnostic(
            file=display,
            line=exc.lineno,
            column=exc.offset,
            severity="error",
            message=f"{type(exc).__name__}: {exc.msg}",
            tool="python",
        )
        return CompileResult(
            ok=False,
            kind="solution",
            source=display,
            arch=arch,
            diagnostics=[diagnostic],
            build_time_s=round(time.monotonic() - start, 3),
            cache_hit=False,
        )
    except ValueError as exc:  # e.g. NUL bytes
        raise CompileError(f"{display} is not valid Python source ({exc}); fix the file") from exc
    nvcc = _optional_nvcc()
    material: dict[str, object] = {
        "level": "solution",
        "arch": arch,
        "display": display,
        "source": text,
        "toolchain": _toolchain_fingerprint(nvcc),
    }
    key = cache.key(material)
    cached = _cached_result(cache, key)
    if cached is not None:
        return cached

    recorded = _record_extensions(text, tools, deadline, timeout_s)
    work = tools.new_dir()
    try:
        if isinstance(recorded, Diagnostic):
            return CompileResult(
                ok=False,
                kind="solution",
                source=display,
                arch=arch,
                diagnostics=[recorded],
                build_time_s=round(time.monotonic() - start, 3),
                cache_hit=False,
            )
        diagnostics = [_import_diagnostic(recorded.error, display)] if recorded.error else []
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
        ran, prepared = _execute(plans, cache, tools, work, deadline, prebuild)
        units = [_unit_result(plan, r, timeout_s) for plan, r in zip(plans, ran, strict=True)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = set(prepared.built + prepared.cached) if prepared is not None else set()
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
    missing = _missing_library_headers(nvcc) if nvcc and recorded.calls else []
    notes += _stand_in_notes(missing, [*unit_texts, *(_read(p) for p in inputs)])
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
    if prepared is not None and prepared.notes():  # what happened now, not kept with the cached result
        result = result.model_copy(update={"notes": [*result.notes, *prepared.notes()]})
    return result


def _buildable(calls: list[dict[str, Any]], notes: list[str]) -> list[Any]:
    """The recorded load_inline calls this node can build for the extension cache: C++ everywhere,
    CUDA where torch was built with CUDA."""
    from pkb_mcp import extensions

    wanted, _ = extensions.parse_requests(calls)
    if extensions.toolchain()["torch_cuda"] != "None":
        return wanted
    cuda = [r.name for r in wanted if r.cuda_sources]
    if cuda:
        notes.append(
            f"extension {', '.join(cuda)} was checked, not built: this node's torch has no CUDA, so it "
            "is built by the first check on a GPU node"
        )
    return [r for r in wanted if not r.cuda_sources]


def prebuild_refusal(request: Any) -> str | None:
    """Why a load_inline request may not be built for the shared extension cache, or None.

    A build job runs no candidate code only if the compilers run no program the candidate chose: its
    flags must pass the same allow-list as compile_kernel's, with no paths, and link only libraries
    by name."""
    base = Path("/nonexistent")
    host = _choose_host_flags(request.extra_cflags, base)
    nvcc = _choose_nvcc_flags([f for f in request.extra_cuda_cflags if not _ARCH_FLAG_RE.fullmatch(f)], base)
    dropped = host.dropped + nvcc.dropped
    dropped += [f for f in (*host.kept, *nvcc.kept) if str(base) in f]
    dropped += [f for f in request.extra_ldflags if not re.fullmatch(r"-l[\w.+-]+", f)]
    if dropped:
        return f"flag {dropped[0]!r} is not on the allow-list for shared builds"
    return None


def _plan_extension(
    call: _RecordedCall,
    n: int,
    calls: Sequence[_RecordedCall],
    *,
    nvcc: _Nvcc | None,
    work: Path,
    arch: str,
    py_lines: list[str],
    display: str,
    notes: list[str],
) -> _UnitPlan:
    same_name = [c for c in calls if c.name == call.name]
    name = call.name if len(same_name) == 1 else f"{call.name}#{n}"
    extension = _safe_identifier(call.name)
    where = f"{display}:{call.line}" if call.line else display
    base = work  # paths in flags name nothing of the host: the sandbox sees only the job's files
    nvcc_flags = _choose_nvcc_flags(call.extra_cuda_cflags, base)
    host_flags = _choose_host_flags(call.extra_cflags, base)
    for label, dropped in (("extra_cuda_cflags", nvcc_flags.dropped), ("extra_cflags", host_flags.dropped)):
        if dropped:
            notes.append(f"extension {name}: {label} not used here: {' '.join(dropped)}")
    include_dirs = [os.path.normpath(base / p) for p in call.extra_include_paths]
    known: list[Diagnostic] = []
    jobs: list[_Job] = []
    cuda_std = None if nvcc_flags.user_std else _EXTENSION_STD
    cxx_std = None if host_flags.user_std else _EXTENSION_STD
    stand_ins = _stand_in_dir(work, nvcc) if nvcc else None
    host = _host_compiler()
    cuda_files: list[tuple[Path, str, _LineMap | None]] = []
    cpp_files: list[tuple[Path, str, _LineMap | None]] = []
    texts: list[tuple[str, Path | None]] = []

    if call.api == "load_inline":
        cuda_prefix = [] if call.no_implicit_headers else list(_INLINE_CUDA_PREFIX)
        cpp_prefix = [] if call.no_implicit_headers else list(_INLINE_CPP_PREFIX)
        if any(s.strip() for s in call.cuda_sources):
            generated = work / "cuda.cu"
            generated.write_text("\n".join([*cuda_prefix, *call.cuda_sources]), encoding="utf-8")
            line_map = _LineMap(
                str(generated), len(cuda_prefix), call.cuda_sources, py_lines, display, f"{name}/cuda_sources"
            )
            cuda_files.append((generated, f"{name}/cuda.cu", line_map))
            texts += [(s, None) for s in call.cuda_sources]
        if any(s.strip() for s in call.cpp_sources):
            generated = work / "main.cpp"
            generated.write_text("\n".join([*cpp_prefix, *call.cpp_sources]), encoding="utf-8")
            line_map = _LineMap(
                str(generated), len(cpp_prefix), call.cpp_sources, py_lines, display, f"{name}/cpp_sources"
            )
            cpp_files.append((generated, f"{name}/main.cpp", line_map))
            texts += [(s, None) for s in call.cpp_sources]
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
    else:
        notes.append(
            f"extension {name}: load() builds source files, which a solution run as one file does not "
            "have; pass the sources to load_inline as strings"
        )

    if cuda_files and nvcc is None:
        raise CompileError("nvcc was not found on PATH; install the CUDA toolkit or set PKB_NVCC")
    deps: dict[str, str] = {}  # a solution's includes are never read on the host
    for k, (source_file, shown, mapping) in enumerate(cuda_files):
        assert nvcc is not None
        argv = _nvcc_argv(
            nvcc,
            source=source_file,
            out=work / f"cuda{k}.cubin",
            arch=arch,
            std=cuda_std,
            extension=extension,
            stand_ins=stand_ins,
            include_dirs=include_dirs,
            extra=nvcc_flags.kept,
        )
        material = _job_material("nvcc", argv, work, source_file, deps)
        jobs.append(_Job("nvcc", argv, material, mapping, {str(source_file): shown}))
    if cpp_files and host is None:
        notes.append(
            f"extension {name}: no C++ compiler (c++, g++, clang++) on PATH; cpp sources not checked"
        )
    elif host is not None:
        for source_file, shown, mapping in cpp_files:
            argv = _cxx_argv(
                host[0],
                nvcc,
                source=source_file,
                std=cxx_std,
                extension=extension,
                stand_ins=stand_ins,
                include_dirs=include_dirs,
                extra=host_flags.kept,
            )
            material = _job_material("c++", argv, work, source_file, deps)
            jobs.append(_Job("c++", argv, material, mapping, {str(source_file): shown}))
    if not jobs and not known:
        notes.append(f"extension {name} ({where}) has no sources to build")

    inputs = dict(deps)
    for source_file, _, mapping in (*cuda_files, *cpp_files):
        if mapping is None:
            inputs[str(source_file)] = _file_digest(str(source_file))
    toolchain = _toolchain_fingerprint(nvcc)
    return _UnitPlan(name=name, jobs=jobs, work=work, toolchain=toolchain, inputs=inputs, diagnostics=known)
