"""A CUDA unit's host compile with its headers' part precompiled (harness/prefixes.py), and the host's side:
which parts a build asks for, and what of a launch's output enters the cache (pkb_mcp/compile/headers.py).

The compiles run the real nvcc where it is installed (CI's machine has it), on a unit whose headers are
CUDA's and the C++ library's: torch's CPU build cannot plan a CUDA extension, so the whole path through
a build launch runs on GPU machines (bench/scripts/build_speed.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import extensions as requests
from harness import nvcc, prefixes
from pkb_mcp import config
from pkb_mcp.compile import extensions, headers

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
ARCH = "-gencode=arch=compute_90,code=sm_90"
UNIT = """#include <cuda_runtime.h>
#include <map>
#include <string>
#include <vector>

__global__ void scale(float* x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}
std::map<std::string, std::vector<float>> named;
void launch(float* x, int n) { scale<<<(n + 127) / 128, 128>>>(x, SCALE, n); }
"""
TOOLCHAIN = {"nvcc": "test"}


def _unit(folder: Path, scale: str = "2.f") -> Path:
    folder.mkdir(parents=True)
    (folder / "cuda.cu").write_text(UNIT.replace("SCALE", scale))
    return folder / "cuda.cu"


def _command(unit: Path, flags: str = "") -> str:
    return f"{NVCC} {ARCH} {flags} --compiler-options '-fPIC' -c {unit} -o cuda.o"


def _symbols(obj: Path) -> list[str]:
    out = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(" ", 2)[-1] for line in out.splitlines() if line.strip())


def test_the_unit_s_own_lines_start_at_its_first_marker_after_its_headers():
    unit = Path("/b/cuda.cu")
    headers_part = 'int from_a_header;\n# 7 "/usr/include/x.h" 3\n' * 4000
    text = f'# 1 "/b/cuda.cu"\n#pragma x\n{headers_part}# 8 "/b/cuda.cu"\nint mine;\n# 9 "/b/cuda.cu"\n'
    at = prefixes.split(text, unit)
    assert at is not None and text[at:].startswith('# 8 "/b/cuda.cu"\nint mine;')
    assert prefixes.split(text.replace(headers_part, "int few;\n"), unit) is None  # not worth a header
    assert prefixes.split(text, Path("/other/cuda.cu")) is None


def test_the_host_compile_is_read_from_nvcc_s_plan_or_not_at_all():
    found = prefixes.host_compile(['gcc -c -x c++ -fPIC "d/k.cudafe1.cpp" -o "k.o"'])
    assert found is not None and found.argv[found.source] == "d/k.cudafe1.cpp"
    assert found.argv[found.output] == "k.o" and found.flags(Path("/x")) == [
        "gcc",
        "-c",
        "-x",
        "c++",
        "-fPIC",
    ]
    assert prefixes.host_compile(['gcc -c -x c++ "d/k.cudafe1.cpp" -o "k.o"', "true"]) is None
    assert prefixes.host_compile(['gcc -x c++ "d/k.cudafe1.cpp" -o "k.o"']) is None  # no -c
    assert prefixes.host_compile(['gcc -c "d/k.cpp" -o "k.o"']) is None
    assert prefixes.host_compile(['gcc -c "unclosed']) is None
    assert prefixes.host_compile(['"$GCC" -c -x c++ "d/k.cudafe1.cpp" -o "k.o"']) is None


@needs_nvcc
def test_an_edited_unit_compiles_with_the_part_its_first_version_made(tmp_path):
    parts = tmp_path / "cache"
    first = _unit(tmp_path / "one")
    done = nvcc.compile_unit(_command(first), first.parent, first, "cuda.o", parts, TOOLCHAIN)
    assert done is not None and done.part is not None and not done.part.precompiled
    key = nvcc.make_part(_command(first), first.parent, first, "cuda.o", TOOLCHAIN, parts)
    assert key == done.part.key and (parts / key / "prefix.h.gch").stat().st_size > 1 << 20
    assert str(tmp_path) not in (parts / key / "prefix.h").read_text()  # the build folder left out
    edited = _unit(tmp_path / "two", scale="3.f")  # another kernel, another build folder
    done = nvcc.compile_unit(_command(edited), edited.parent, edited, "cuda.o", parts, TOOLCHAIN)
    assert done is not None and done.part == prefixes.Part(key, True)
    plain = _unit(tmp_path / "three", scale="3.f")
    assert nvcc.compile_unit(_command(plain), plain.parent, plain, "cuda.o", None, TOOLCHAIN) is not None
    assert _symbols(edited.parent / "cuda.o") == _symbols(plain.parent / "cuda.o")
    assert "_Z5scalePffi" in _symbols(edited.parent / "cuda.o")
    assert not [p for p in edited.parent.iterdir() if p.name.startswith(".nvcc")]  # no scratch left


@needs_nvcc
def test_a_part_is_shared_where_the_host_compile_s_input_is_the_same_and_only_there(tmp_path):
    parts = tmp_path / "cache"
    first = _unit(tmp_path / "one")
    key = nvcc.make_part(_command(first), first.parent, first, "cuda.o", TOOLCHAIN, parts)

    def part(name: str, flags: str = "", toolchain: dict[str, str] = TOOLCHAIN) -> prefixes.Part | None:
        unit = _unit(tmp_path / name)
        done = nvcc.compile_unit(_command(unit, flags), unit.parent, unit, "cuda.o", parts, toolchain)
        assert done is not None
        return done.part

    # a macro no header reads leaves the part's text as it was: the same part
    assert part("define", "-DUNREAD=1") == prefixes.Part(key, True)
    # one that a header reads, a host compiler flag, another toolchain: another part
    for other in (part("read", "-D_GLIBCXX_ASSERTIONS"), part("host", "-Xcompiler -O1")):
        assert other is not None and other.key != key and not other.precompiled
    other = part("toolchain", toolchain={"nvcc": "other"})
    assert other is not None and other.key != key and not other.precompiled


def _request(name: str) -> requests.Request:
    return requests.Request(name=name, cpp_sources=("",), cuda_sources=("__global__ void k() {}",))


def test_a_build_asks_only_for_the_parts_its_units_did_not_find():
    one, two = _request("one"), _request("two")
    result = {
        "extensions": [
            {"key": "k1", "ok": True, "parts": [{"key": "a" * 64, "precompiled": False}]},
            {"key": "k2", "ok": True, "parts": [{"key": "b" * 64, "precompiled": True}]},
            {"key": "k3", "ok": True, "parts": [{"key": "c" * 64, "precompiled": False}]},  # not this build's
            {"key": "k1", "parts": "not a list"},
        ]
    }
    assert extensions.unmade_parts(result, {"k1": one, "k2": two}) == {"a" * 64: one}
    assert extensions.unmade_parts(None, {"k1": one}) == {}


class _Tools:
    isolated = True

    def __init__(self, root: Path, made: bytes = b"x" * 2048) -> None:
        self.root, self.made, self.params = root, made, []

    def new_dir(self) -> Path:
        path = self.root / f"launch{len(self.params)}"
        path.mkdir()
        return path

    def run(self, mode: str, launch_dir: Path, params: dict[str, Any], timeout_s: float) -> None:
        self.params.append(params)
        keys = [f"{len(self.params)}" * 64] if params.get("parts") else []
        for key in keys:
            folder = launch_dir / prefixes.PREFIXES / key
            folder.mkdir(parents=True)
            (folder / prefixes.HEADER).write_text("int from_a_header;\n")
            (folder / f"{prefixes.HEADER}.gch").write_bytes(self.made)
        entries = [{"key": k, "ok": True, "cached": False, "log": "", "elapsed_s": 1.0} for k in keys]
        (launch_dir / "build.json").write_text(json.dumps({"parts": entries}))


def test_a_part_is_asked_for_once_made_in_the_background_and_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "1")
    monkeypatch.setattr(headers, "_asked_parts", set())
    tools = _Tools(tmp_path)
    key = "1" * 64
    thread = headers.prepare_parts_soon({key: _request("one")}, tools)
    assert thread is not None
    thread.join(30)
    assert [p["parts"][0]["name"] for p in tools.params] == ["one"]  # the request, whose unit it is
    assert (headers.parts_root() / key / "prefix.h.gch").read_bytes() == tools.made
    assert headers.prepare_parts_soon({key: _request("one")}, tools) is None  # asked already
    monkeypatch.setattr(headers, "_asked_parts", set())
    assert headers.prepare_parts_soon({key: _request("one")}, tools) is None  # in the cache
    assert headers.prepare_parts_soon({"not a key": _request("one")}, tools) is None
    assert str(config.extensions_dir()) in str(headers.parts_root())


def test_what_a_launch_leaves_enters_the_cache_only_as_plain_files_under_a_key(tmp_path, monkeypatch):
    from sandbox.untrusted import LaunchFiles

    made = tmp_path / prefixes.PREFIXES
    good, linked, unkeyed, half, unasked = "a" * 64, "b" * 64, "not-a-key", "c" * 64, "d" * 64
    for name in (good, linked, unkeyed, half, unasked):
        (made / name).mkdir(parents=True)
        (made / name / prefixes.HEADER).write_text("int x;\n")
    for name in (good, unkeyed, unasked):
        (made / name / f"{prefixes.HEADER}.gch").write_bytes(b"gch")
    (tmp_path / "secret").write_text("host file")
    (made / linked / f"{prefixes.HEADER}.gch").symlink_to(tmp_path / "secret")
    asked = [good, linked, unkeyed, half]  # the keys the launch was asked to make: not `unasked`
    assert headers.install_parts(LaunchFiles(tmp_path), asked) == 1
    assert sorted(p.name for p in headers.parts_root().iterdir()) == [good]
    monkeypatch.setattr(headers, "MAX_HEADER_BYTES", 2)
    (made / half / f"{prefixes.HEADER}.gch").write_bytes(b"too big")
    assert headers.install_parts(LaunchFiles(tmp_path), asked) == 0


def test_no_part_is_asked_for_without_isolated_sandboxes(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "1")
    tools = _Tools(tmp_path)
    tools.isolated = False
    assert headers.prepare_parts_soon({"1" * 64: _request("one")}, tools) is None
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "0")
    tools.isolated = True
    assert headers.prepare_parts_soon({"1" * 64: _request("one")}, tools) is None
    assert tools.params == []


@needs_nvcc
def test_a_precompiled_part_gcc_will_not_take_is_reported_and_its_text_compiled(tmp_path):
    parts = tmp_path / "cache"
    first = _unit(tmp_path / "one")
    key = nvcc.make_part(_command(first), first.parent, first, "cuda.o", TOOLCHAIN, parts)
    (parts / key / "prefix.h.gch").write_bytes(b"not a precompiled header")
    edited = _unit(tmp_path / "two", scale="3.f")
    done = nvcc.compile_unit(_command(edited), edited.parent, edited, "cuda.o", parts, TOOLCHAIN)
    assert done is not None and done.part is not None and done.part.key == key
    assert not done.part.precompiled and prefixes.INVALID in done.part.rejected, done.part
    assert "_Z5scalePffi" in _symbols(edited.parent / "cuda.o")


@needs_nvcc
def test_a_compile_that_fails_with_the_part_is_compiled_as_nvcc_would_without_it(tmp_path):
    parts = tmp_path / "cache"
    first = _unit(tmp_path / "one")
    key = nvcc.make_part(_command(first), first.parent, first, "cuda.o", TOOLCHAIN, parts)
    (parts / key / "prefix.h").write_text("this is not C++;\n")  # what GCC reads where it refuses the .gch
    (parts / key / "prefix.h.gch").write_bytes(b"not a precompiled header")
    edited = _unit(tmp_path / "two", scale="3.f")
    done = nvcc.compile_unit(_command(edited), edited.parent, edited, "cuda.o", parts, TOOLCHAIN)
    assert done is not None and done.part is not None and not done.part.precompiled
    assert done.part.rejected.startswith("the compile with it failed"), done.part
    assert "_Z5scalePffi" in _symbols(edited.parent / "cuda.o")
