"""pkb_mcp.compile's parsers, on output captured from nvcc 13.0 and gcc, and a unit's result from its
compiler runs (no compiler runs: fast tier)."""

from __future__ import annotations

import textwrap

from pkb_mcp.compile import parse_diagnostics, parse_ptxas_resources
from pkb_mcp.compile.units import Command, CommandRecord, UnitPlan, unit_result

# ---------------------------------------------------------------------------------------------------
# parsers, on output captured from nvcc 13.0 and on the older ptxas layout

PTXAS_13 = """\
ptxas info    : 4096 bytes gmem
ptxas info    : Compiling entry function '_Z9big_localIfEvPKT_PS0_i' for 'sm_90a'
ptxas info    : Function properties for _Z9big_localIfEvPKT_PS0_i
    8192 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 8192 bytes cumulative stack size
ptxas info    : Compile time = 30.578 ms
ptxas info    : Compiling entry function '_Z4smemPf' for 'sm_90a'
ptxas info    : Function properties for _Z4smemPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 4224 bytes smem
ptxas info    : Compile time = 1.463 ms
"""

PTXAS_OLDER = """\
ptxas info    : 0 bytes gmem, 24 bytes cmem[3]
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 4 bytes smem, 360 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for _Z6helperv
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_ptxas_resources_parse_both_layouts() -> None:
    big, smem = parse_ptxas_resources(PTXAS_13)
    assert (big.mangled, big.registers, big.stack_frame_bytes, big.cumulative_stack_bytes) == (
        "_Z9big_localIfEvPKT_PS0_i",
        32,
        8192,
        8192,
    )
    assert (smem.registers, smem.shared_bytes, smem.barriers, smem.constant_bytes) == (12, 4224, 1, None)

    [kernel] = parse_ptxas_resources(PTXAS_OLDER)  # _Z6helperv is a device function, not a kernel
    assert kernel.mangled == "_Z6kernelPf" and kernel.arch == "sm_90a"
    assert (kernel.registers, kernel.shared_bytes, kernel.constant_bytes) == (8, 4, 368)
    assert (kernel.stack_frame_bytes, kernel.spill_store_bytes, kernel.spill_load_bytes) == (16, 8, 12)


def test_diagnostics_parse_nvcc_gcc_and_tool_messages() -> None:
    output = textwrap.dedent(
        """\
        k.cu(11): error: expression must have class type but it has type "int"
          template <typename T> void tmpl(T t) { t.nothing(); }
                                                 ^
                  detected during instantiation of "void tmpl(T) [with T=int]" at line 12

        k.cu(2): warning #177-D: variable "unused" was declared but never referenced
            int unused;
                ^

        Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

        k.cu(2): warning #177-D: variable "unused" was declared but never referenced
            int unused;
                ^

        In file included from main.cpp:1:
        main.cpp:3:52: error: expected ';' before '}' token
        main.cpp:5:9: warning: unused variable 'y' [-Wunused-variable]
        nvcc fatal   : Unsupported gpu architecture 'compute_99'
        ptxas warning : Registers are spilled to local memory in function '_Z1kv', 8 bytes spill stores
        2 errors detected in the compilation of "k.cu".
        """
    )
    found = parse_diagnostics(output, tool="nvcc")
    assert [(d.file, d.line, d.column, d.severity, d.tool) for d in found] == [
        ("k.cu", 11, None, "error", "nvcc"),
        ("k.cu", 2, None, "warning", "nvcc"),  # printed twice (host and device pass), kept once
        ("main.cpp", 3, 52, "error", "nvcc"),
        ("main.cpp", 5, 9, "warning", "nvcc"),
        (None, None, None, "error", "nvcc"),
        (None, None, None, "warning", "ptxas"),
    ]
    assert "detected during instantiation" in found[0].message
    assert found[1].code == "177-D" and found[3].code == "-Wunused-variable"
    assert found[3].message == "unused variable 'y'"


# ---------------------------------------------------------------------------------------------------
# a unit's result from its compiler runs


def test_a_units_build_time_is_what_ran_now_not_its_cached_commands(tmp_path) -> None:
    plan = UnitPlan(
        name="ext",
        commands=[Command("nvcc", ["nvcc", "cuda.cu"], {}), Command("c++", ["g++", "main.cpp"], {})],
        work=tmp_path,
        toolchain={},
    )
    cuda = CommandRecord(returncode=0, output="", elapsed_s=1.25)
    cpp = CommandRecord(returncode=0, output="", elapsed_s=30.5)
    # an edit of the kernel: the CUDA unit compiled now, the C++ check taken from the cache
    edited = unit_result(plan, [(cuda, False), (cpp, True)], timeout_s=60)
    assert edited.build_time_s == 1.25 and not edited.cache_hit
    # everything from the cache: the original build's time, as a cached .cu file reports it
    cached = unit_result(plan, [(cuda, True), (cpp, True)], timeout_s=60)
    assert cached.build_time_s == 30.5 and cached.cache_hit
    # a first build: the slowest command, the two ran side by side
    assert unit_result(plan, [(cuda, False), (cpp, False)], timeout_s=60).build_time_s == 30.5
