"""The JIT toolchain every launch gets: what torch's extension builds and Triton need inside the sandbox.

- PATH: the interpreter's scripts folder first (pip installs `ninja` there; torch refuses to build
  extensions without it), then CUDA's bin folder, then the system's.
- CUDA_HOME: the CUDA toolkit (from PKB_CUDA_HOME, CUDA_HOME, nvcc on PATH, or /usr/local/cuda), so
  nvcc and the CUDA headers are found the same way in every launch. A toolkit outside /usr is mounted
  read-only by the Docker backend (`extra_mounts`).
- CXX and CC: the host compilers by their real paths. Debian's `c++` and `cc` are links through
  /etc/alternatives, which the sandbox (with its own /etc) does not have.
- TORCH_CUDA_ARCH_LIST: the node's GPU architectures (from `nvidia-smi`), so a build launch without GPUs
  builds for the same architectures as a launch on them, and never for every architecture torch knows.

Computed once per process; stdlib only.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sysconfig


def _cuda_home() -> str | None:
    for name in ("PKB_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return os.path.realpath(value)
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return os.path.realpath("/usr/local/cuda") if os.path.isdir("/usr/local/cuda") else None


def _arch_list() -> str:
    configured = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if configured:
        return configured
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    caps = sorted({line.strip() for line in out.splitlines() if line.strip()})
    return ";".join(caps)


@functools.cache
def jit_env() -> dict[str, str]:
    """Variables for every launch (PATH is the launch's whole search path)."""
    scripts = sysconfig.get_path("scripts")
    cuda_home = _cuda_home()
    path = [scripts] if scripts else []
    if cuda_home:
        path.append(os.path.join(cuda_home, "bin"))
    path += ["/usr/local/bin", "/usr/bin", "/bin"]
    env = {"PATH": ":".join(dict.fromkeys(path))}
    for var, names in (("CXX", ("c++", "g++", "clang++")), ("CC", ("cc", "gcc", "clang"))):
        found = next((shutil.which(n) for n in names if shutil.which(n)), None)
        if found:
            env[var] = os.path.realpath(found)
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    arch = _arch_list()
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def extra_mounts() -> list[str]:
    """Folders the toolchain needs that the Docker backend does not mount already (it mounts /usr
    and the interpreter's installation)."""
    cuda_home = jit_env().get("CUDA_HOME")
    return [cuda_home] if cuda_home and not cuda_home.startswith("/usr/") else []
