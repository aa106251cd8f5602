"""pkb_mcp.compile: nvcc builds of .cu files and of the load_inline extensions of solution files.

CPU only. The build tests run the real nvcc and are skipped where it is missing; the parser tests run
everywhere. Only `test_solution_with_torch_headers_builds_and_hits_cache` compiles torch's headers (tens of
seconds); every other solution uses `no_implicit_headers=True` so its build takes about a second.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from pkb_mcp.compile import (
    CompileError,
    compile_file,
    compile_source,
)
from pkb_mcp.compile import toolchain as pkb_toolchain
from pkb_mcp.launches import ToolLaunches
from sandbox import select_backend

pytestmark = pytest.mark.integration

# Every import of a solution and every compiler run is a sandbox launch; the process backend is the fast
# one for these tests (test_sandbox_docker.py runs compile launches in Docker).
TOOLS = ToolLaunches(select_backend("process"))


def _nvcc_available() -> bool:
    configured = os.environ.get("PKB_NVCC")
    if configured:
        return os.access(configured, os.X_OK)
    return shutil.which("nvcc") is not None or os.access(pkb_toolchain.DEFAULT_NVCC, os.X_OK)


needs_nvcc = pytest.mark.skipif(
    not _nvcc_available(), reason="nvcc not found (install the CUDA toolkit or set PKB_NVCC)"
)


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _line_of(path: Path, needle: str) -> int:
    lines = path.read_text().splitlines()
    return next(n for n, line in enumerate(lines, start=1) if needle in line)


SAXPY = """\
__global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

# Line 3 uses a name that does not exist: nvcc reports it on that line.
UNDEFINED_NAME = """\
__global__ void broken(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = not_declared_anywhere;
}
"""

# 64 live floats per thread under a 32-register cap (1024 threads x 2 blocks per SM) must spill, and
# the dynamically indexed array lives in local memory (stack frame).
SPILLS = """\
__global__ void __launch_bounds__(1024, 2) spills(const float* in, float* out, int k) {
    float acc[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = in[threadIdx.x * 64 + j];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] = acc[j] * acc[(j + r) % 64] + 1.0f;
    float big[512];
    for (int j = 0; j < 512; ++j) big[j] = in[(j * 7 + threadIdx.x) % 4096];
    float s = big[k % 512];
#pragma unroll
    for (int j = 0; j < 64; ++j) s += acc[j];
    out[threadIdx.x] = s;
}
"""


# ---------------------------------------------------------------------------------------------------
# .cu files


@needs_nvcc
def test_good_kernel_builds_with_resources(tmp_path: Path) -> None:
    source = _write(tmp_path, "saxpy.cu", SAXPY)
    result = compile_file(source, tools=TOOLS, cache_dir=tmp_path / "cache")
    assert result.ok, result.summary()
    assert result.kind == "cuda" and result.arch == "sm_90a"
    assert not result.errors()
    [unit] = result.units
    [kernel] = unit.kernels
    assert kernel.kernel.startswith("saxpy(")  # demangled
    assert kernel.mangled.startswith("_Z5saxpy")
    assert kernel.arch == "sm_90a"
    assert kernel.registers > 0
    assert kernel.stack_frame_bytes == 0 and kernel.spill_store_bytes == 0
    assert "arch=compute_90a,code=sm_90a" in unit.command and "-Xptxas -v" in unit.command
    summary = result.summary()
    assert "ok" in summary.splitlines()[0] and "saxpy(float, float const*, float*, int)" in summary


@needs_nvcc
def test_syntax_error_is_reported_on_its_line(tmp_path: Path) -> None:
    result = compile_source(UNDEFINED_NAME, filename="kernels/broken.cu", tools=TOOLS, cache_dir=tmp_path)
    assert not result.ok
    [error] = result.errors()
    assert (error.file, error.line, error.tool) == ("kernels/broken.cu", 3, "nvcc")
    assert "not_declared_anywhere" in error.message
    assert result.units[0].kernels == []
    assert "kernels/broken.cu:3: error" in result.summary()
    assert "not_declared_anywhere" in result.units[0].log


@needs_nvcc
def test_local_array_and_register_cap_show_stack_and_spills(tmp_path: Path) -> None:
    result = compile_source(SPILLS, filename="spills.cu", tools=TOOLS, cache_dir=tmp_path)
    assert result.ok, result.summary()
    [kernel] = result.units[0].kernels
    assert kernel.registers <= 32
    assert kernel.stack_frame_bytes >= 2048  # the 512-float array at least
    assert kernel.spill_store_bytes > 0 and kernel.spill_load_bytes > 0
    spill_warnings = [d for d in result.warnings() if d.tool == "ptxas" and "spilled" in d.message]
    assert spill_warnings, result.summary()


@needs_nvcc
def test_second_build_is_a_cache_hit_and_edits_are_not(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = _write(tmp_path, "saxpy.cu", SAXPY)
    started = time.monotonic()
    first = compile_file(source, tools=TOOLS, cache_dir=cache)
    first_s = time.monotonic() - started
    started = time.monotonic()
    second = compile_file(source, tools=TOOLS, cache_dir=cache)
    second_s = time.monotonic() - started
    assert not first.cache_hit and second.cache_hit and second.units[0].cache_hit
    assert second.build_time_s == first.build_time_s  # the original build's time
    assert second.units[0].kernels == first.units[0].kernels
    assert second_s < first_s / 5, (first_s, second_s)

    source.write_text(source.read_text() + "\n// edited\n")
    assert not compile_file(source, tools=TOOLS, cache_dir=cache).cache_hit
    assert not compile_file(source, tools=TOOLS, cache_dir=cache, arch="sm_90").cache_hit


@needs_nvcc
def test_failed_build_is_cached_too(tmp_path: Path) -> None:
    first = compile_source(UNDEFINED_NAME, filename="broken.cu", tools=TOOLS, cache_dir=tmp_path)
    second = compile_source(UNDEFINED_NAME, filename="broken.cu", tools=TOOLS, cache_dir=tmp_path)
    assert second.cache_hit and not second.ok
    assert second.errors() == first.errors()


@needs_nvcc
def test_timeout_kills_the_build_and_is_not_cached(tmp_path: Path) -> None:
    timed_out = compile_source(SAXPY, filename="saxpy.cu", tools=TOOLS, cache_dir=tmp_path, timeout_s=0.01)
    assert not timed_out.ok
    assert any("build timed out after 0.01 s" in d.message for d in timed_out.errors())
    again = compile_source(SAXPY, filename="saxpy.cu", tools=TOOLS, cache_dir=tmp_path)
    assert again.ok and not again.cache_hit


# ---------------------------------------------------------------------------------------------------
# .py solutions

TORCH_SOLUTION = '''
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_kernel(const float* x, float* y, float alpha, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int never_used = 0;
    if (i < n) y[i] = alpha * x[i];
}

torch::Tensor scale(torch::Tensor x, double alpha) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), static_cast<float>(alpha), n);
    return y;
}
"""

ext = load_inline(
    name="scale_ext",
    cpp_sources="torch::Tensor scale(torch::Tensor x, double alpha);",
    cuda_sources=cuda_source,
    functions=["scale"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


def solution(x):
    return ext.scale(x, 2.0)
'''


@needs_nvcc
def test_solution_with_torch_headers_builds_and_hits_cache(tmp_path: Path) -> None:
    """The one test that compiles torch's headers, as a real load_inline solution does."""
    path = _write(tmp_path, "solution.py", TORCH_SOLUTION)
    started = time.monotonic()
    result = compile_file(path, tools=TOOLS, cache_dir=tmp_path / "cache")
    first_s = time.monotonic() - started
    assert result.ok, result.summary()
    assert result.kind == "solution" and not result.cache_hit
    [unit] = result.units
    assert unit.name == "scale_ext"
    assert [k.kernel for k in unit.kernels] == ["scale_kernel(float const*, float*, float, int)"]
    assert unit.kernels[0].registers > 0
    # load_inline prepends three #include lines; the warning must still land on the .py line.
    [warning] = [d for d in result.warnings() if "never_used" in d.message]
    assert (warning.file, warning.line) == (str(path), _line_of(path, "int never_used"))
    assert "--use_fast_math" in unit.command and "-std=c++20" in unit.command
    assert any("functions=" in note and "not built" in note for note in result.notes)

    started = time.monotonic()
    again = compile_file(path, tools=TOOLS, cache_dir=tmp_path / "cache")
    assert again.cache_hit and again.units[0].cache_hit
    assert again.units[0].kernels == unit.kernels
    assert time.monotonic() - started < first_s / 5


SMALL_SOLUTION = '''
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="small_ext",
    cpp_sources="void launch(float* x, int n);",
    cuda_sources="""
__global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
void launch(float* x, int n) { twice<<<(n + 127) / 128, 128>>>(x, n); }
""",
    functions=["launch"],
    no_implicit_headers=True,
)
'''


@needs_nvcc
def test_solution_edit_of_cuda_string_reuses_the_cpp_check(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = _write(tmp_path, "solution.py", SMALL_SOLUTION)
    first = compile_file(path, tools=TOOLS, cache_dir=cache)
    assert first.ok, first.summary()
    assert [k.kernel for k in first.units[0].kernels] == ["twice(float*, int)"]
    assert len(list(cache.glob("*.json"))) == 3  # the result, the nvcc run, the c++ run

    path.write_text(path.read_text().replace("*= 2.0f", "*= 3.0f"))
    second = compile_file(path, tools=TOOLS, cache_dir=cache)
    assert second.ok and not second.cache_hit
    assert len(list(cache.glob("*.json"))) == 5  # a new result and a new nvcc run; the c++ run reused


BROKEN_SOLUTION = '''
import torch
from torch.utils.cpp_extension import load_inline

CUDA = """
__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += missing_value;
}
"""

CPP = """
void launch(int n) {
    int wrong = "text";
}
"""

ext = load_inline(
    name="broken_ext",
    cpp_sources=[CPP],
    cuda_sources=[CUDA],
    functions=["launch", "not_declared"],
    extra_cuda_cflags=["-DSCALE=2", "-ccbin=/tmp/some-compiler", "-Xcompiler", "-B/tmp/x"],
    no_implicit_headers=True,
)
'''


@needs_nvcc
def test_solution_errors_point_at_lines_of_the_py_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "solution.py", BROKEN_SOLUTION)
    result = compile_file(path, tools=TOOLS, cache_dir=tmp_path / "cache")
    assert not result.ok
    by_tool = {d.tool: d for d in result.errors()}
    assert by_tool["nvcc"].file == str(path)
    assert by_tool["nvcc"].line == _line_of(path, "missing_value")
    assert by_tool["c++"].file == str(path)
    assert by_tool["c++"].line == _line_of(path, 'int wrong = "text"')
    assert f"{path}:{_line_of(path, 'missing_value')}: error" in result.summary()
    [undeclared] = [d for d in result.warnings() if "not_declared" in d.message]
    assert undeclared.line == _line_of(path, "ext = load_inline(")
    # Flags that could pick the program to run are not passed on, and the note says so.
    command = result.units[0].command
    assert "-DSCALE=2" in command and "/tmp/some-compiler" not in command and "-B/tmp/x" not in command
    assert any("-ccbin=/tmp/some-compiler" in note and "-B/tmp/x" in note for note in result.notes)


@needs_nvcc
def test_solution_load_reads_no_host_files(tmp_path: Path) -> None:
    # load() names files; the host never reads them (a solution could name any file of the host)
    _write(
        tmp_path, "kernel.cu", "// HOST_ONLY_MARKER\n__global__ void from_file(float* x) { x[0] = 1.0f; }\n"
    )
    path = _write(
        tmp_path,
        "solution.py",
        """
        import os
        from torch.utils.cpp_extension import load

        here = os.path.dirname(__file__)
        ext = load(name="file_ext", sources=[os.path.join(here, "kernel.cu"), "/etc/shadow"])
        """,
    )
    result = compile_file(path, tools=TOOLS, cache_dir=tmp_path / "cache")
    assert result.units and not result.units[0].kernels
    assert any("load() builds source files" in note for note in result.notes)
    assert "HOST_ONLY_MARKER" not in result.model_dump_json()


def test_solution_syntax_error_gives_file_and_line(tmp_path: Path) -> None:
    source = "import torch\n\n\ndef solution(x):\n    return x +\n"
    result = compile_source(source, filename="solution.py", tools=TOOLS, cache_dir=tmp_path)
    assert not result.ok
    [error] = result.errors()
    assert (error.file, error.line) == ("solution.py", 5)
    assert "SyntaxError" in error.message
    assert "solution.py:5" in result.summary()


def test_solution_without_extension_is_ok_with_a_note(tmp_path: Path) -> None:
    source = "import torch\n\n\ndef solution(x):\n    return x * 2\n"
    result = compile_source(source, filename="solution.py", tools=TOOLS, cache_dir=tmp_path)
    assert result.ok and result.units == []
    assert any("nothing to build" in note for note in result.notes)
    assert compile_source(source, filename="solution.py", tools=TOOLS, cache_dir=tmp_path).cache_hit


def test_solution_import_error_gives_its_line_and_runs_outside_the_host(tmp_path: Path) -> None:
    source = textwrap.dedent(
        f"""
        import os
        import torch

        assert os.environ.get("HOME") != {os.environ.get("HOME", "")!r}, "ran with the host's environment"


        def load_helpers():
            import a_module_that_does_not_exist


        load_helpers()
        """
    ).lstrip("\n")
    result = compile_source(source, filename="solution.py", tools=TOOLS, cache_dir=tmp_path)
    assert not result.ok
    [error] = result.errors()
    assert error.tool == "python" and error.file == "solution.py"
    assert error.line == 8  # the failing import inside load_helpers(), not the call site
    assert error.message.startswith("ModuleNotFoundError: No module named 'a_module_that_does_not_exist'")
    assert "solution.py:11 in <module>" in error.message  # trimmed traceback keeps the solution's frames
    assert "pkb_mcp" not in error.message and "importlib" not in error.message


def test_solution_that_hangs_at_import_is_killed(tmp_path: Path) -> None:
    source = "import time\n\ntime.sleep(600)\n"
    started = time.monotonic()
    result = compile_source(source, filename="solution.py", tools=TOOLS, cache_dir=tmp_path, timeout_s=2)
    assert time.monotonic() - started < 15
    [error] = result.errors()
    assert error.message.startswith("build timed out after 2 s while importing the solution")


# ---------------------------------------------------------------------------------------------------
# bad input


def test_bad_inputs_raise_compile_error_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CompileError, match="does not exist"):
        compile_file(tmp_path / "missing.cu", tools=TOOLS, cache_dir=tmp_path)
    with pytest.raises(CompileError, match=r"unsupported extension; pass a \.cu or \.cuh"):
        compile_source("int x;", filename="kernel.txt", tools=TOOLS, cache_dir=tmp_path)
    with pytest.raises(CompileError, match="is empty"):
        compile_source("  \n", filename="kernel.cu", tools=TOOLS, cache_dir=tmp_path)
    with pytest.raises(CompileError, match="use one like sm_90a"):
        compile_source(SAXPY, filename="kernel.cu", tools=TOOLS, cache_dir=tmp_path, arch="hopper")

    monkeypatch.setenv("PKB_NVCC", str(tmp_path / "no-nvcc-here"))
    with pytest.raises(CompileError, match=r"PKB_NVCC=.* is not an executable file"):
        compile_source(SAXPY, filename="kernel.cu", tools=TOOLS, cache_dir=tmp_path)

    monkeypatch.delenv("PKB_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pkb_toolchain, "DEFAULT_NVCC", str(tmp_path / "nvcc"))
    with pytest.raises(CompileError) as caught:
        compile_source(SAXPY, filename="kernel.cu", tools=TOOLS, cache_dir=tmp_path)
    assert str(caught.value) == "nvcc was not found on PATH; install the CUDA toolkit or set PKB_NVCC"


@needs_nvcc
def test_original_benchmark_helper_is_found_on_first_call() -> None:
    """Files written for the original benchmark build with utils.cuda_helpers.compile_cuda_extension
    inside a helper called on first use: the import works and the build is found and checked."""
    from .conftest import CANDIDATES

    result = compile_file(CANDIDATES / "original_helper_cuda.py", tools=TOOLS, cache_dir=Path(os.devnull))
    assert result.ok, result.summary()
    [unit] = result.units
    assert unit.name == "original_style_ext"
    assert [k.kernel for k in unit.kernels] == ["scale_kernel(float const*, float*, float, int)"]
