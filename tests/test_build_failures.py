"""A failed build's message leads with the compiler's first errors (pkb_mcp/compile/parse.first_errors,
pkb_mcp/compile/failures.py), mapped to the solution's lines, in a rank's result (check, bench, profile,
so `pkb eval` too) and in the extension cache's notes (compile_kernel). On torch build logs as nvcc and
g++ write them; no compiler runs."""

# ruff: noqa: E501 -- compiler logs are kept line for line, as nvcc, g++ and ld write them

from __future__ import annotations

from harness.extensions import Request
from pkb_mcp.compile import failures
from pkb_mcp.compile.extensions import Prepared
from pkb_mcp.compile.parse import first_errors
from pkb_mcp.launches import RankOutcome
from pkb_mcp.runs.run import rank_result
from pkb_mcp.runs.verdicts import failed_to_build

NVCC_COMMAND = (
    "/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output cuda.cuda.o.d "
    '-DTORCH_EXTENSION_NAME=gather_ext -DTORCH_API_INCLUDE_EXTENSION_H -DPYBIND11_COMPILER_TYPE=\\"_gcc\\" '
    + " ".join(f"-isystem /usr/local/lib/python3.12/site-packages/torch/include/dir{i}" for i in range(20))
    + " -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ --expt-relaxed-constexpr "
    "-gencode=arch=compute_90a,code=sm_90a --compiler-options '-fPIC' -O3 -std=c++17 "
    "-c <build>/extensions/6f1c/cuda.cu -o cuda.cuda.o"
)
NVCC_LOG = f"""\
[1/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=gather_ext -fPIC -std=c++17 -c <build>/extensions/6f1c/main.cpp -o main.o
[2/3] {NVCC_COMMAND}
FAILED: cuda.cuda.o
{NVCC_COMMAND}
<build>/extensions/6f1c/cuda.cu(10): warning #177-D: variable "unused" was declared but never referenced
      int unused = 0;
          ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

<build>/extensions/6f1c/cuda.cu(13): error: argument of type "int64_t *" is incompatible with parameter of type "long long *"
      gather_kernel<<<blocks, 256>>>(idx.data_ptr<int64_t>(), out.data_ptr<float>(), n);
                                     ^

<build>/extensions/6f1c/cuda.cu(14): error: identifier "n_rows" is undefined
      return n_rows;
             ^

2 errors detected in the compilation of "<build>/extensions/6f1c/cuda.cu".
ninja: build stopped: subcommand failed.
"""

GXX_LOG = """\
[1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=scale_ext -fPIC -std=c++17 -c /tmp/pkb-extensions/ab12/main.cpp -o main.o
FAILED: main.o
c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=scale_ext -fPIC -std=c++17 -c /tmp/pkb-extensions/ab12/main.cpp -o main.o
/tmp/pkb-extensions/ab12/main.cpp: In function 'at::Tensor scale(at::Tensor, double)':
/tmp/pkb-extensions/ab12/main.cpp:4:12: error: 'factr' was not declared in this scope; did you mean 'factor'?
    4 |     return factr * x;
      |            ^~~~~
      |            factor
ninja: build stopped: subcommand failed.
"""

LINK_LOG = """\
[2/2] c++ main.o cuda.cuda.o -shared -o scale_ext.so
FAILED: scale_ext.so
/usr/bin/ld: main.o: in function `scale(at::Tensor)': main.cpp:(.text+0x2a): undefined reference to `launch_scale(float*, int)'
collect2: error: ld returned 1 exit status
ninja: build stopped: subcommand failed.
"""

KERNEL = """\
__global__ void gather_kernel(const long long* idx, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)idx[i];
}
int64_t launch(torch::Tensor idx, torch::Tensor out, int64_t n) {
    int unused = 0;
    int blocks = (n + 255) / 256;
    int64_t rows = n;
    gather_kernel<<<blocks, 256>>>(idx.data_ptr<int64_t>(), out.data_ptr<float>(), n);
    return n_rows;
}"""
SOLUTION = f'''import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
{KERNEL}
"""

CPP_SRC = "int64_t launch(torch::Tensor idx, torch::Tensor out, int64_t n);"


def solution(idx, out):
    ext = load_inline("gather_ext", CPP_SRC, cuda_sources=CUDA_SRC, functions=["launch"])
    return ext.launch(idx, out, idx.numel())
'''
REQUEST = Request(
    name="gather_ext",
    cpp_sources=("int64_t launch(torch::Tensor idx, torch::Tensor out, int64_t n);",),
    cuda_sources=("\n" + KERNEL + "\n",),
    functions=("launch",),
)
TORCH_ERROR = f"RuntimeError: Error building extension 'gather_ext': {NVCC_LOG}"


def test_the_first_nvcc_errors_are_found_far_below_the_command_lines():
    assert NVCC_LOG.index("error: argument") > 2000, "the error sits 2 KB into the log"
    errors = first_errors(NVCC_LOG)
    assert [d.one_line() for d in errors] == [
        'cuda.cu:13: error: argument of type "int64_t *" is incompatible with parameter of type "long long *"',
        'cuda.cu:14: error: identifier "n_rows" is undefined',
    ]
    assert [d.tool for d in errors] == ["nvcc", "nvcc"]
    assert len(first_errors(NVCC_LOG, limit=1)) == 1


def test_g_plus_plus_errors_and_linker_errors_are_found():
    (gxx,) = first_errors(GXX_LOG)
    assert (
        gxx.one_line()
        == "main.cpp:4:12: error: 'factr' was not declared in this scope; did you mean 'factor'?"
    )
    assert gxx.tool == "c++"
    (link,) = first_errors(LINK_LOG, limit=1)
    assert "undefined reference to `launch_scale(float*, int)'" in link.message and link.tool == "ld"
    assert first_errors("ninja: no work to do.\n") == []


def test_a_failed_build_leads_with_its_errors_at_the_solutions_lines():
    sources = failures.SolutionSources("gather.py", SOLUTION, [REQUEST])
    message = failures.build_failure(TORCH_ERROR, sources)
    assert message is not None
    first, second = message.splitlines()
    # cuda.cu line 13: 3 header lines, then CUDA_SRC, whose line 10 (KERNEL's 9th) is this one
    line = (
        SOLUTION.splitlines().index(
            "    gather_kernel<<<blocks, 256>>>(idx.data_ptr<int64_t>(), out.data_ptr<float>(), n);"
        )
        + 1
    )
    assert first == (
        f"failed to build extension 'gather_ext': gather.py:{line}: error: argument of type \"int64_t *\" "
        'is incompatible with parameter of type "long long *"'
    )
    assert second == f'gather.py:{line + 1}: error: identifier "n_rows" is undefined'
    # without the solution's sources the generated file's lines are given
    unmapped = failures.build_failure(TORCH_ERROR)
    assert unmapped is not None and unmapped.startswith(
        "failed to build extension 'gather_ext': cuda.cu:13: error:"
    )
    assert (
        failures.build_failure("TypeError: solution() takes 2 positional arguments but 3 were given") is None
    )


def test_a_rank_whose_build_failed_says_so_first_and_any_other_error_is_an_error():
    # what a rank records: its exception's first 2000 characters, and the trimmed traceback's end
    error = TORCH_ERROR[:2000]
    traceback = ('  File "gather.py", line 12, in solution\n' + TORCH_ERROR)[-6000:]
    assert "error: argument" not in error, "the rank's error alone has lost the compiler's error"
    failed = rank_result(RankOutcome(rank=0, state="error", error=error, traceback=traceback))
    assert failed.message.startswith("failed to build extension 'gather_ext': cuda.cu:13: error: argument")
    sources = failures.SolutionSources("gather.py", SOLUTION, [REQUEST])
    mapped = rank_result(RankOutcome(rank=0, state="error", error=error, traceback=traceback), sources)
    assert mapped.message.startswith("failed to build extension 'gather_ext': gather.py:")
    raised = rank_result(RankOutcome(rank=1, state="error", error="TypeError: bad call", stage="trial 0"))
    assert raised.message == "raised TypeError: bad call during trial 0"
    assert failed_to_build([failed, raised]) and not failed_to_build([raised])


def test_a_build_that_failed_before_the_run_is_explained_from_its_whole_log():
    # the launch raises with the cache's failure log; the host kept the whole log from the build launch
    sources = failures.SolutionSources("gather.py", SOLUTION, [REQUEST], logs={"gather_ext": NVCC_LOG})
    message = failures.build_failure(
        "RuntimeError: Error building extension 'gather_ext': [1/3] c++ -MMD", sources
    )
    assert message is not None and "error: argument of type" in message.splitlines()[0]
    prepared = Prepared(failed=["gather_ext"], logs={"gather_ext": NVCC_LOG})
    assert prepared.notes() == [
        'extension gather_ext failed to build: cuda.cu:13: error: argument of type "int64_t *" is '
        'incompatible with parameter of type "long long *"'
    ]
