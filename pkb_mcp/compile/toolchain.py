"""The compilers and headers a build uses: nvcc, torch's and Python's headers, the host compiler, stand-ins
for CUDA library headers a toolkit lacks, the fingerprint that keys the cache, and the command lines that
call the compilers as torch's extension builds do. Only asks the tools for their versions and search
paths; nothing of a candidate runs here.

Offers `Nvcc` with `find_nvcc` / `optional_nvcc`, `host_compiler`, `nvcc_argv` / `cxx_argv`, the language
standards (`CU_STD`, `EXTENSION_STD`), `stand_in_dir` / `stand_in_notes`, `toolchain_fingerprint` and
`DEFAULT_NVCC`. Imports only pkb_mcp.compile.results (and torch, for its header locations)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pkb_mcp.compile.results import CompileError

# Bump when the parser or the flags change, so old cache entries stop matching.
_CACHE_SCHEMA = 1


DEFAULT_NVCC = "/usr/local/cuda/bin/nvcc"  # where nvcc is looked for when PKB_NVCC is unset and PATH lacks it


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
CU_STD = "c++17"


EXTENSION_STD = "c++20"


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


@dataclass(frozen=True)
class Nvcc:
    """nvcc by its real path, its version, and the include directories it searches on its own."""

    path: str
    version: str
    include_dirs: tuple[str, ...]


@dataclass(frozen=True)
class _TorchHeaders:
    include_dirs: tuple[str, ...]
    python_include: str
    torch_version: str
    has_cuda_cmake_macros: bool


def find_nvcc() -> Nvcc:
    configured = os.environ.get("PKB_NVCC")
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise CompileError(
                f"PKB_NVCC={configured} is not an executable file; point it at nvcc or unset it"
            )
        return _nvcc_info(os.path.realpath(configured))
    found = shutil.which("nvcc")
    if found is None and os.access(DEFAULT_NVCC, os.X_OK):
        found = DEFAULT_NVCC
    if found is None:
        raise CompileError("nvcc was not found on PATH; install the CUDA toolkit or set PKB_NVCC")
    # by its real path: /usr/local/cuda is often a link through /etc/alternatives, which the sandbox lacks
    return _nvcc_info(os.path.realpath(found))


@functools.cache
def _nvcc_info(nvcc: str) -> Nvcc:
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
    return Nvcc(path=nvcc, version=version.stdout.strip(), include_dirs=tuple(dict.fromkeys(dirs)))


@functools.cache
def _torch_headers() -> _TorchHeaders:
    import torch
    from torch.utils.cpp_extension import include_paths

    dirs = tuple(include_paths())
    python_include = sysconfig.get_path("include", scheme="posix_prefix") or sysconfig.get_path("include")
    has_macros = any(os.path.isfile(os.path.join(d, "c10/cuda/impl/cuda_cmake_macros.h")) for d in dirs)
    return _TorchHeaders(dirs, python_include, str(torch.__version__), has_macros)


@functools.cache
def host_compiler() -> tuple[str, str] | None:
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


def _missing_library_headers(nvcc: Nvcc) -> list[str]:
    return [
        name
        for name in _LIBRARY_STAND_INS
        if not any(os.path.isfile(os.path.join(d, name)) for d in nvcc.include_dirs)
    ]


def stand_in_dir(root: Path, nvcc: Nvcc) -> Path | None:
    """Write stand-ins for the library headers this toolkit lacks; None when it has them all."""
    if not _missing_library_headers(nvcc):
        return None
    directory = root / "stand-in-headers"
    directory.mkdir(exist_ok=True)
    for name, body in _LIBRARY_STAND_INS.items():  # all of them, since they include each other
        (directory / name).write_text(f"#pragma once\n// pkb-mcp stand-in: {name} is not installed\n{body}")
    return directory


def toolchain_fingerprint(nvcc: Nvcc | None) -> dict[str, str]:
    torch_headers = _torch_headers()
    host = host_compiler()
    return {
        "schema": str(_CACHE_SCHEMA),
        "nvcc": nvcc.version if nvcc else "absent",
        "nvcc_includes": ":".join(nvcc.include_dirs) if nvcc else "",
        "host": host[1] if host else "absent",
        "torch": torch_headers.torch_version,
        "torch_includes": ":".join(torch_headers.include_dirs),
        "python_include": torch_headers.python_include,
    }


def optional_nvcc() -> Nvcc | None:
    try:
        return find_nvcc()
    except CompileError:
        return None


def stand_in_notes(nvcc: Nvcc | None, texts: Iterable[str]) -> list[str]:
    """A note for the result where sources that use the CUDA libraries were checked against stand-ins."""
    missing = _missing_library_headers(nvcc) if nvcc is not None else []
    if missing and any(_LIBRARY_HEADER_USE.search(t) for t in texts):
        return [
            f"this CUDA toolkit lacks {', '.join(missing)}; stand-in declarations of their handle types let "
            "ATen/cuda headers parse, so calls into those libraries cannot be checked here"
        ]
    return []


def nvcc_argv(
    nvcc: Nvcc,
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
    """nvcc compiling `source` to a cubin for `arch`, with the defines and headers of torch's extension
    builds and ptxas reporting each kernel's resources."""
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


def cxx_argv(
    cxx: str,
    nvcc: Nvcc | None,
    *,
    source: Path,
    std: str | None,
    extension: str,
    stand_ins: Path | None,
    include_dirs: Sequence[str],
    extra: Sequence[str],
) -> list[str]:
    """The host compiler checking a C++ `source`'s syntax against torch's, Python's and CUDA's headers,
    with the code model of torch's extension builds (-fPIC): GCC takes a build's precompiled torch
    header (harness/headers.py) only for a compile of the same code model."""
    torch_headers = _torch_headers()
    argv = [cxx, "-fsyntax-only", "-fPIC", "-x", "c++"]
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
