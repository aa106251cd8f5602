"""pkb_mcp/compile/literal_calls.py: a solution's load_inline calls read from its text, where the text
alone fixes them, so that a kernel edit costs a build and no discovery launch. Whatever it reads must
be what the discovery launch (the solution imported in the sandbox) records; anything less plain is
left to discovery."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.extensions import Request
from pkb_mcp.compile import extensions
from pkb_mcp.compile.literal_calls import literal_calls

ROOT = Path(__file__).resolve().parents[1]
HEAD = (
    'from torch.utils.cpp_extension import load_inline\nCPP = "int f();"\nCUDA = "__global__ void k() {}"\n'
)


def calls(body: str) -> list[dict[str, Any]] | None:
    return literal_calls(HEAD + textwrap.dedent(body))


def test_module_level_sources_passed_by_name_are_read():
    found = calls(
        """
        _ext = None
        def solution(x):
            global _ext
            if _ext is None:
                _ext = load_inline("ext", CPP, cuda_sources=[CUDA], functions=["f"], verbose=True,
                                   extra_cuda_cflags=["-O3", "--use_fast_math"])
            return _ext.f(x)
        """
    )
    assert found is not None and len(found) == 1
    call = found[0]
    assert call["name"] == "ext" and call["cpp_sources"] == ["int f();"]
    assert call["cuda_sources"] == ["__global__ void k() {}"] and call["functions"] == ["f"]
    assert call["extra_cuda_cflags"] == ["-O3", "--use_fast_math"] and call["with_cuda"] is None
    wanted, why = extensions.parse_requests(found)
    assert [r.name for r in wanted] == ["ext"] and why == []


def test_concatenated_literals_and_the_module_import_are_read():
    text = (
        "from torch.utils import cpp_extension as ce\n"
        'A = "int "\nB = A + "f();"\nE = ce.load_inline(name="e", cpp_sources=B)\n'
    )
    found = literal_calls(text)
    assert found is not None and found[0]["cpp_sources"] == ["int f();"]


@pytest.mark.parametrize(
    "body",
    [
        'load_inline("e", CPP + str(1))',  # a value computed at run time
        'load_inline(f"e{1}", CPP)',  # an f-string
        'CPP = CPP + "x"\nload_inline("e", CPP)',  # a source bound twice
        'def build(src):\n    return load_inline("e", src)',  # a parameter
        'load_inline("e", CPP, None, None, ["f"])',  # positional past cuda_sources (torch versions differ)
        'load_inline("e", CPP, build_directory="/tmp/x")',  # an argument a request does not keep
        'load_inline("e", CPP, extra_include_paths=["inc"])',
        'load_inline("e", CPP, use_pch=True)',
        "load_inline(*ARGS)",
        'load_inline("e", CPP, **OPTIONS)',
        'builder = load_inline\nbuilder("e", CPP)',  # the builder passed on as a value
        'load_inline("e", CPP)\ntorch.utils.cpp_extension.load_inline("g", CPP)',  # a path not read
        'from torch.utils.cpp_extension import load\nload_inline("e", CPP)\nload("g", ["g.cpp"])',
        'def load_inline(*a):\n    pass\nload_inline("e", CPP)',  # not torch's
        'if FLAG:\n    CUDA2 = "x"\nload_inline("e", CPP, CUDA2)',  # bound under a condition
        "x = 1",  # no call at all
    ],
)
def test_anything_not_plainly_literal_is_left_to_discovery(body):
    assert calls(body) is None


def test_the_original_helper_is_read_as_the_load_inline_it_makes():
    text = (
        "from utils.cuda_helpers import compile_cuda_extension\n"
        "SRC = 'x'\nE = compile_cuda_extension('h', SRC, ['-lineinfo'])\n"
    )
    found = literal_calls(text)
    assert found is not None
    assert found[0]["cpp_sources"] == [""] and found[0]["cuda_sources"] == ["x"]
    assert found[0]["extra_cuda_cflags"] == ["-O3", "-lineinfo"]
    assert (
        literal_calls(text.replace("from utils.cuda_helpers import", "from utils.cuda_helpers import x,"))
        is None
    )
    assert (
        literal_calls("from utils import cuda_helpers\nE = cuda_helpers.compile_cuda_extension('h', 'x')\n")
        is None
    )


class Tools:
    """Counts tool launches: a literal solution's preparation must not start a discovery launch."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def new_dir(self) -> Path:
        raise AssertionError("no launch directory wanted")

    def run(self, mode: str, *args: Any) -> Any:
        self.runs.append(mode)
        raise AssertionError(f"no {mode} launch wanted")


def test_preparing_a_literal_solution_starts_no_discovery_launch(monkeypatch):
    built: list[list[str]] = []

    def build_requests(wanted: list[Any], tools: Any, timeout_s: float) -> tuple[Any, None]:
        built.append([r.name for r in wanted])
        return extensions.Prepared(), None

    monkeypatch.setattr(extensions, "build_requests", build_requests)
    tools = Tools()
    prepared = extensions.prepare(HEAD + 'E = load_inline("e", CPP)\n', tools, 30.0)
    assert tools.runs == [] and built == [["e"]] and [r.name for r in prepared.requests] == ["e"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "path",
    [
        "examples/001_allreduce_cuda_oneshot.py",
        "examples/original/013_gemm_allreduce_cpp.py",
        "tests/candidates/original_helper_cuda.py",
        "tests/candidates/helper_cuda_bindings_apart.py",
        "tests/candidates/helper_cuda_torch_free.py",
    ],
)
def test_what_the_text_gives_is_what_the_discovery_launch_records(path):
    from pkb_mcp.launches import ToolLaunches
    from sandbox import select_backend

    text = (ROOT / path).read_text()
    literal = literal_calls(text)
    assert literal is not None
    found = extensions.discover(text, ToolLaunches(select_backend("process")), 120.0)
    assert isinstance(found, dict), found
    assert extensions.parse_requests(literal) == extensions.parse_requests(found["calls"])
    assert extensions.parse_requests(literal)[0], "at least one request"


def requests_of(path: str) -> list[Any]:
    found = literal_calls((ROOT / path).read_text())
    assert found is not None, path
    wanted, why = extensions.parse_requests(found)
    assert wanted and not why, why
    return wanted


def test_a_cuda_unit_that_parses_torch_headers_is_told_how_to_rebuild_faster():
    [helper] = requests_of("tests/candidates/original_helper_cuda.py")
    advice = extensions.rebuild_advice(helper)
    assert advice is not None and "no_implicit_headers=True" in advice
    assert advice.startswith(
        "original_style_ext's CUDA source includes torch/extension.h and defines PYBIND11_MODULE"
    )
    # torch/types.h, which load_inline adds, and ATen's headers: said so
    for path in ("tests/candidates/helper_cuda_bindings_apart.py", "examples/001_allreduce_cuda_oneshot.py"):
        [request] = requests_of(path)
        said = extensions.rebuild_advice(request)
        assert said is not None and "includes torch's headers (load_inline adds torch/types.h)" in said, path
    # a CUDA unit without torch headers, and one without CUDA: nothing to say
    [torch_free] = requests_of("tests/candidates/helper_cuda_torch_free.py")
    assert torch_free.no_implicit_headers and extensions.rebuild_advice(torch_free) is None
    assert extensions.rebuild_advice(Request(name="cpu", cpp_sources=("int f();",))) is None
    own = Request(
        name="own", cpp_sources=("",), cuda_sources=("#include <ATen/ATen.h>",), no_implicit_headers=True
    )
    assert "own's CUDA source includes torch's headers," in (extensions.rebuild_advice(own) or "")
    # a mention in a comment is not an include
    quiet = Request(
        name="q", cpp_sources=("",), cuda_sources=("// torch/extension.h\n",), no_implicit_headers=True
    )
    assert extensions.rebuild_advice(quiet) is None


def test_only_a_build_made_now_carries_the_advice(monkeypatch, tmp_path):
    """build_requests adds the advice for what its launch built, not for what the cache had or what
    failed, and a result's notes end with it."""
    [helper] = requests_of("tests/candidates/original_helper_cuda.py")
    failing = Request(
        name="broken", cpp_sources=("",), cuda_sources=("#include <torch/extension.h>\nint x;",)
    )

    class Built:
        isolated = True

        def new_dir(self) -> Path:
            return tmp_path

        def run(self, mode: str, *args: Any) -> Any:
            return type("Outcome", (), {"timed_out": False})()

    def install(todo: list[Any], result: Any, timed_out: bool, launch_dir: Path, prepared: Any) -> None:
        prepared.built += [r.name for _, r in todo if r.name != "broken"]
        prepared.failed += [r.name for _, r in todo if r.name == "broken"]

    for name in ("prepare_soon", "prepare_parts_soon", "_install_objects"):
        monkeypatch.setattr(extensions, name, lambda *a, **k: None)
    monkeypatch.setattr(extensions, "_entry_state", lambda key: None)
    monkeypatch.setattr(extensions, "read_result", lambda path: {})
    monkeypatch.setattr(extensions, "_install_results", install)
    prepared, _ = extensions.build_requests([helper, failing], Built(), 30.0)
    assert prepared.advice == [extensions.rebuild_advice(helper)]
    assert prepared.notes()[-1] == prepared.advice[0]
    monkeypatch.setattr(extensions, "_entry_state", lambda key: "ok")  # in the cache: no build, no advice
    cached, _ = extensions.build_requests([helper], Built(), 30.0)
    assert cached.cached == ["original_style_ext"] and cached.advice == []
