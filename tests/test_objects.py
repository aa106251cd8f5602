"""harness/objects.py: an extension's build file run one unit at a time, each unit's object cached by
what enters its compiler, every step as argv. Stand-in compilers (a Python script that copies) keep the
unit tests fast; one integration test builds a real C++ extension twice (tests/test_extensions.py runs
builds in Docker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import extensions, objects

TOOLCHAIN = {"torch": "x", "cxx": "c++"}

# a build file in the form torch writes: variables, a compile rule with a dependency file, a link rule
BUILD = """ninja_required_version = 1.3
cxx = c++
cflags = -DX=1 -O2{extra}

rule compile
  command = {py} {cc} compile $in $out {dep} $cflags
  depfile = $out.d
  deps = gcc

rule link
  command = {py} {cc} link $out $in

build main.o: compile {src}
build ext.so: link main.o

default ext.so
"""

# the stand-in compiler: copies its input and its flags into the object and writes the dependency
# file; fails as a compiler does on a source that says ERROR; links by concatenating
COMPILER = """import sys
what, args = sys.argv[1], sys.argv[2:]
if what == "link":
    with open(args[0], "w") as out:
        out.write("".join(open(p).read() for p in args[1:]))
    sys.exit(0)
source, output, dep, flags = args[0], args[1], args[2], args[3:]
text = open(source).read()
if "ERROR" in text:
    print("main.cpp:1:1: error: no")
    sys.exit(1)
open(output + ".d", "w").write(f"{output}: {source} {dep}\\n")
open(output, "w").write(text + " ".join(flags) + "\\n")
"""


def build_dir(tmp_path: Path, name: str, source: str, dep: str = "", extra: str = "") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "main.cpp").write_text(source)
    compiler = tmp_path / "cc.py"
    compiler.write_text(COMPILER)
    dep = dep or str(d / "main.cpp")
    text = BUILD.format(src=d / "main.cpp", dep=dep, py=sys.executable, cc=compiler, extra=extra)
    (d / "build.ninja").write_text(text)
    return d


def keys(d: Path, toolchain: dict[str, str] = TOOLCHAIN) -> dict[str, str]:
    """The unit's key as harness/extensions.py `unit_keys` would make it (here of its text alone)."""
    return {"main.cpp": objects.object_key("main.cpp", (d / "main.cpp").read_text(), {}, toolchain)}


def test_a_build_file_becomes_its_compile_steps_then_its_link(tmp_path):
    d = build_dir(tmp_path, "b", "int f();")
    steps = objects.plan(d / "build.ninja")
    assert [(s.rule, s.output) for s in steps] == [("compile", "main.o"), ("link", "ext.so")]
    assert steps[0].inputs == (str(d / "main.cpp"),)
    assert "-DX=1 -O2" in steps[0].command and "$" not in steps[0].command
    assert steps[1].command == f"{sys.executable} {tmp_path / 'cc.py'} link ext.so main.o"


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda t: t.replace("rule link", "rule dlink"), "rule 'link'"),
        (lambda t: t.replace("$cflags", "$undefined_flags"), "$undefined_flags is not defined"),
        (lambda t: t.replace("build ext.so: link main.o", ""), "compile steps then one link"),
        (lambda t: t.replace("build main.o: compile", "build main.o: compile | extra"), "not understood"),
    ],
)
def test_a_build_file_it_does_not_understand_is_left_to_ninja(tmp_path, edit, why):
    d = build_dir(tmp_path, "b", "int f();")
    (d / "build.ninja").write_text(edit((d / "build.ninja").read_text()))
    with pytest.raises(objects.PlanError, match=re.escape(why)):
        objects.plan(d / "build.ninja")


def test_an_object_is_compiled_once_and_then_taken_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = build_dir(tmp_path, "first", "int f();")
    done = objects.run(objects.plan(first / "build.ninja"), first, TOOLCHAIN, cache, cache, keys(first))
    assert done.compiled == [str(first / "main.cpp")] and done.stored == done.compiled and not done.cached
    assert (first / "ext.so").read_text().startswith("int f();")
    # the same unit in another build directory (another request: another link) is not compiled again
    second = build_dir(tmp_path, "second", "int f();")
    done = objects.run(objects.plan(second / "build.ninja"), second, TOOLCHAIN, cache, cache, keys(second))
    assert done.cached == [str(second / "main.cpp")] and not done.compiled
    assert (second / "ext.so").read_bytes() == (first / "ext.so").read_bytes()
    # an edited source, another toolchain: compiled
    third = build_dir(tmp_path, "third", "int g();")
    assert objects.run(
        objects.plan(third / "build.ninja"), third, TOOLCHAIN, cache, None, keys(third)
    ).compiled
    fourth = build_dir(tmp_path, "fourth", "int f();")
    other = {**TOOLCHAIN, "torch": "y"}
    assert objects.run(
        objects.plan(fourth / "build.ninja"), fourth, other, cache, None, keys(fourth, other)
    ).compiled
    # a unit the caller gave no key is compiled and never stored
    fifth = build_dir(tmp_path, "fifth", "int k();")
    done = objects.run(objects.plan(fifth / "build.ninja"), fifth, TOOLCHAIN, cache, cache, {})
    assert done.compiled and not done.stored


def test_a_step_runs_as_argv_so_a_flag_s_command_substitution_is_only_text(tmp_path):
    """A flag carrying `$(...)` and backticks reaches the compiler as it is: no shell reads it."""
    flag = " '-DX=$(touch pwned)' '-DY=`touch pwned2`'"
    d = build_dir(tmp_path, "b", "int f();", extra=flag)
    objects.run(objects.plan(d / "build.ninja"), d, TOOLCHAIN, None, None, keys(d))
    assert not (d / "pwned").exists() and not (d / "pwned2").exists()
    assert "-DX=$(touch pwned) -DY=`touch pwned2`" in (d / "main.o").read_text()


@pytest.mark.parametrize(
    "command",
    [
        "cp $in $out && touch pwned",
        "cp $in $out; touch pwned",
        "cp $in `touch pwned`",
        "cp $in $$(touch pwned)",
    ],
)
def test_a_build_file_whose_steps_need_a_shell_is_not_run_here(tmp_path, command):
    d = build_dir(tmp_path, "b", "int f();")
    text = (d / "build.ninja").read_text()
    (d / "build.ninja").write_text(re.sub(r"(rule compile\n  command = ).*", rf"\g<1>{command}", text))
    with pytest.raises(objects.PlanError, match="not plain words for the shell"):
        objects.plan(d / "build.ninja")
    assert not (d / "pwned").exists()


def test_a_unit_that_read_a_file_outside_the_toolchain_is_compiled_but_never_stored(tmp_path):
    header = tmp_path / "mine.h"
    header.write_text("#define N 3")
    d = build_dir(tmp_path, "b", '#include "mine.h"', dep=str(header))
    cache = tmp_path / "cache"
    done = objects.run(objects.plan(d / "build.ninja"), d, TOOLCHAIN, cache, cache, keys(d))
    assert done.compiled and not done.stored and not (tmp_path / "cache").exists()
    # a header under the toolchain's roots (here the interpreter's prefix) is covered by the key
    d2 = build_dir(tmp_path, "b2", "int h();", dep=os.path.join(sys.prefix, "include"))
    assert objects.run(objects.plan(d2 / "build.ninja"), d2, TOOLCHAIN, None, cache, keys(d2)).stored


def test_a_compiler_error_names_the_unit_and_keeps_the_compiler_s_output(tmp_path):
    d = build_dir(tmp_path, "b", "ERROR")
    with pytest.raises(RuntimeError, match=r"FAILED: main\.o") as raised:
        objects.run(objects.plan(d / "build.ninja"), d, TOOLCHAIN, None, None, keys(d))
    assert "main.cpp:1:1: error: no" in str(raised.value)


@pytest.mark.integration
def test_a_real_extension_s_bindings_are_compiled_once_for_two_requests(tmp_path, monkeypatch):
    """Two requests that differ only in their link flags: the second links the first's object."""
    monkeypatch.setenv(extensions.CACHE_ENV, str(tmp_path / "cache"))
    store = tmp_path / "cache" / objects.OBJECTS
    first = extensions.request_of("ext_units", ["int twice(int x) { return 2 * x; }"], functions=["twice"])
    extensions.build(first, tmp_path / "a", store=store)
    units = extensions.read_mark(tmp_path / "a", extensions.UNITS_MARK)
    assert (units["cached"], units["compiled"]) == ([], [str(tmp_path / "a" / "main.cpp")])
    assert set(units["seconds"]) == {"main.cpp", objects.LINK}, "how long the unit and the link took"
    assert units["seconds"]["main.cpp"] > units["seconds"][objects.LINK] > 0
    second = extensions.request_of(
        "ext_units", ["int twice(int x) { return 2 * x; }"], functions=["twice"], extra_ldflags=["-lm"]
    )
    library = extensions.build(second, tmp_path / "b", store=store)
    units = extensions.read_mark(tmp_path / "b", extensions.UNITS_MARK)
    assert (units["cached"], units["compiled"]) == ([str(tmp_path / "b" / "main.cpp")], [])
    assert set(units["seconds"]) == {objects.LINK}, "a unit from the cache took no time of its own"
    assert extensions.load_library(second, library).twice(21) == 42


def test_a_launch_imports_cpp_extension_only_when_the_solution_does():
    """install() routes load_inline when torch.utils.cpp_extension is first imported, not before: a
    plain solution's ranks never pay for that import (setuptools included)."""
    probe = (
        "import sys\n"
        "from harness import extensions\n"
        "extensions.install()\n"
        "before = 'torch.utils.cpp_extension' in sys.modules\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "import torch.utils.cpp_extension as ce\n"
        "print(before, type(load_inline).__name__, type(ce.load_inline).__name__)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["False", "_Loader", "_Loader"]


# ---------------------------------------------------------------- torch's header precompiled (headers.py)


def cxx_step(tmp_path: Path, opening: str = "#include <torch/extension.h>") -> objects.Step:
    source = tmp_path / "main.cpp"
    source.write_text(f"{opening}\nint f() {{ return 1; }}\n")
    flags = "-DTORCH_EXTENSION_NAME=ext1 -DX=1 -isystem /inc -fPIC"
    command = f"c++ -MMD -MF main.o.d {flags} -c {source} -o main.o"
    return objects.Step("compile", "main.o", (str(source),), command)


def test_a_header_s_flags_leave_out_the_source_output_dependency_file_and_extension_name(tmp_path):
    from harness import headers

    step = cxx_step(tmp_path)
    assert headers.flags(step) == ["c++", "-DX=1", "-isystem", "/inc", "-fPIC"]
    other = objects.Step("compile", "main.o", step.inputs, step.command.replace("ext1", "ext2"))
    assert headers.flags(other) == headers.flags(step)
    # the key is the flag set's, which the host computes from the request alone
    assert headers.key(["-DX=2"], True, TOOLCHAIN) != headers.key(["-DX=1"], True, TOOLCHAIN)
    assert headers.key(["-DX=1"], False, TOOLCHAIN) != headers.key(["-DX=1"], True, TOOLCHAIN)
    assert headers.flags(cxx_step(tmp_path, "#include <vector>")) is None, "a source that opens otherwise"
    # no_implicit_headers: the C++ source as given, after blank and comment lines
    opened_later = cxx_step(tmp_path, "\n  \n// bindings\n#include <torch/extension.h>")
    assert headers.flags(opened_later) == headers.flags(step)
    assert headers.flags(cxx_step(tmp_path, "int x;\n#include <torch/extension.h>")) is None
    too_late = "\n" * headers.MAX_OPENING_LINES + "#include <torch/extension.h>"
    assert headers.flags(cxx_step(tmp_path, too_late)) is None
    assert headers.flags(objects.Step("cuda_compile", "x.o", step.inputs, step.command)) is None


def test_a_build_finds_the_header_in_the_cache_or_compiles_as_before(tmp_path):
    from harness import headers

    step = cxx_step(tmp_path)
    root = tmp_path / "cache" / "headers"
    key = headers.key(["-DX=1"], False, TOOLCHAIN)
    assert headers.command_with(step, root, key) is None, "none made yet"
    found = headers.path(root, key)
    found.parent.mkdir(parents=True)
    found.write_bytes(b"gch")
    assert headers.command_with(step, root, key) is None, "no stub beside it: GCC could not fall back"
    found.with_suffix("").write_text(headers.stub_text(Path("/torch/include/torch/extension.h")))
    assert headers.command_with(step, root, None) is None, "no key: no header"
    command = headers.command_with(step, root, key)
    assert command is not None and command.startswith(f"c++ -I{root / found.parent.parent.name} -MMD ")
    assert command.endswith(step.command.split(" ", 1)[1]), "the step's own command otherwise"
    found.unlink()
    found.symlink_to(tmp_path / "main.cpp")
    assert headers.command_with(step, root, key) is None, "a link is not a header"


def test_header_sets_made_side_by_side_keep_their_own_folders(tmp_path, monkeypatch):
    """A set that fails at once (CUDA asked of a torch without it) leaves the other's work alone."""
    import concurrent.futures
    import subprocess as real_subprocess
    import time

    from harness import build

    real_steps = extensions.build_steps

    def steps(request, sources, directory):
        if request.with_cuda:
            raise OSError("no CUDA here")
        time.sleep(0.3)  # the other set has failed and cleaned up by now
        return real_steps(request, sources, directory)

    def compile_header(argv, cwd, **kwargs):
        assert Path(cwd).is_dir(), "its folder is still there"
        Path(argv[argv.index("-o") + 1]).write_bytes(b"gch")
        return real_subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(extensions, "build_steps", steps)
    monkeypatch.setattr(build.subprocess, "run", compile_header)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sets = [{"extra_cflags": [], "with_cuda": cuda} for cuda in (True, False)]
        failed, made = pool.map(lambda data: build.make_header(data, tmp_path, None), sets)
    assert not failed["ok"] and "no CUDA here" in failed["log"]
    assert made["ok"] and not made["cached"] and made["key"], made
    assert (tmp_path / "headers" / made["key"] / "torch" / "extension.h.gch").read_bytes() == b"gch"
    assert not (tmp_path / "headers-scratch").exists(), "both folders removed"


def test_a_syntax_check_takes_a_header_made_with_a_build_s_flags_and_says_so(tmp_path):
    """The C++ syntax check (compile/toolchain.py cxx_argv) and a build's C++ unit (torch's build file)
    share their code model, so GCC takes a header precompiled with the build's flags for the check
    (a small header in place of torch's, whose compile takes a minute); one made otherwise it refuses,
    and the check says so; no header in the view, no header offered."""
    from harness import build, headers
    from pkb_mcp.compile.toolchain import EXTENSION_STD, cxx_argv, host_compiler

    if host_compiler() is None:
        pytest.skip("no C++ compiler")
    cxx = host_compiler()[0]
    request = extensions.Request(name="ext", cpp_sources=("",))
    steps = extensions.build_steps(request, extensions.source_files(request, tmp_path), tmp_path)
    unit_flags = headers.flags(next(s for s in steps or () if s.rule == "compile"))
    assert unit_flags is not None
    small = tmp_path / "small.h"
    small.write_text("#pragma once\nint from_the_header(int x);\n")
    source = tmp_path / "main.cpp"
    source.write_text("#include <torch/extension.h>\nint twice(int x) { return 2 * from_the_header(x); }\n")
    argv = cxx_argv(
        cxx,
        None,
        source=source,
        std=EXTENSION_STD,
        extension="ext",
        stand_ins=None,
        include_dirs=[],
        extra=[],
    )
    root = tmp_path / "view"

    def made_with(key: str, flags: list[str]) -> None:
        target = headers.path(root, key)
        target.parent.mkdir(parents=True)
        target.with_suffix("").write_text(headers.stub_text(small))
        compiled = [cxx, *flags[1:], "-x", "c++-header", str(small), "-o", str(target)]
        subprocess.run(compiled, cwd=tmp_path, check=True, capture_output=True, timeout=120)

    made_with("build", unit_flags)
    made_with("other", [cxx, "-std=c++20", "-fno-PIC"])
    env = build.compiler_env(tmp_path)
    for key, taken in (("build", True), ("other", False)):
        ran = build._run_planned({"argv": argv, "header": key}, tmp_path, env, float("inf"), root)
        assert ran["returncode"] == 0 and ran["header"] is taken, (key, ran)
    bare = [cxx, "-fsyntax-only", "-x", "c++", str(source)]  # torch's own header out of reach: fast
    ran = build._run_planned({"argv": bare, "header": "none"}, tmp_path, env, float("inf"), root)
    assert "header" not in ran and "torch/extension.h" in ran["output"], "none in the view: none offered"
