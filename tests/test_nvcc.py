"""harness/nvcc.py: one nvcc compile with its host and device front ends side by side.

The plan is read from a dry run's text (the shape nvcc 13 prints, abridged); the compiles run the real
nvcc where it is installed (CI's machine has it; CUDA compiles there, it just cannot run), and the
split compile must give the object nvcc gives: the same symbols, the kernel's code embedded."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness import nvcc, objects
from harness.commands import NotPlain, words

DRY_RUN = "\n".join(
    [
        "#$ _NVVM_BRANCH_=nvvm",
        "#$ _SPACE_= ",
        "#$ CICC_PATH=/usr/local/cuda/bin/../nvvm/bin",
        "#$ PATH=/usr/local/cuda/bin/../nvvm/bin:/usr/bin",
        '#$ gcc -E -x c++ -D__CUDACC__ "k.cu" -o "d/k.cpp4.ii"',
        '#$ cudafe++ --c++17 --gen_c_file_name "d/k.cudafe1.cpp" --gen_module_id_file'
        ' --module_id_file_name "d/k.module_id" "d/k.cpp4.ii"',
        '#$ gcc -D__CUDA_ARCH__=900 -E -x c++ "k.cu" -o "d/k.cpp1.ii"',
        '#$ "$CICC_PATH/cicc" --c++17 -arch compute_90 --module_id_file_name "d/k.module_id" "d/k.cpp1.ii"',
        '#$ ptxas -arch=sm_90 -m64 "d/k.ptx" -o "d/k.cubin"',
        '#$ fatbinary --create="d/k.fatbin" -64 "--image3=kind=elf,sm=90,file=d/k.cubin"',
        '#$ gcc -c -x c++ "d/k.cudafe1.cpp" -o "k.o"',
        "",
    ]
)
CICC_READS = '--module_id_file_name "d/k.module_id" "d/k.cpp1.ii"'

KERNEL = """#include <cuda_runtime.h>
__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.f;
}
void launch(float* x, int n) { add_one<<<(n + 127) / 128, 128>>>(x, n); }
"""
ARCH = "-gencode=arch=compute_90,code=sm_90"

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def test_a_dry_run_becomes_two_chains_then_the_host_compile():
    plan = nvcc.plan(DRY_RUN)
    assert plan is not None
    assert plan.env["CICC_PATH"] == "/usr/local/cuda/bin/../nvvm/bin" and plan.env["_SPACE_"] == ""
    assert [nvcc._tool(c) for c in plan.host] == ["gcc", "cudafe++"]
    assert [nvcc._tool(c) for c in plan.device] == ["gcc", "cicc", "ptxas", "fatbinary"]
    assert plan.rest == ['gcc -c -x c++ "d/k.cudafe1.cpp" -o "k.o"']
    assert plan.module_id == "d/k.module_id"
    # cudafe++ reads the id written beforehand instead of writing it, so cicc need not wait for it
    assert (
        "--gen_module_id_file" not in plan.host[1] and '--module_id_file_name "d/k.module_id"' in plan.host[1]
    )


def test_a_dry_run_with_a_dependency_file_moves_the_device_preprocessor_to_its_chain():
    # with -MD -MF, nvcc preprocesses for the device first and makes the dependency file itself
    lines = DRY_RUN.split("\n")
    lines.insert(4, lines.pop(6))
    lines.insert(6, "#$ -- Filter Dependencies -- > k.o.d")
    plan = nvcc.plan("\n".join(lines))
    assert plan is not None and plan.dependencies == "k.o.d"
    assert [nvcc._tool(c) for c in plan.host] == ["gcc", "cudafe++"] and "cpp4.ii" in plan.host[0]
    assert [nvcc._tool(c) for c in plan.device] == ["gcc", "cicc", "ptxas", "fatbinary"]
    assert "cpp1.ii" in plan.device[0] and not any("Filter" in c for c in plan.host + plan.device + plan.rest)


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("--gen_module_id_file ", ""),  # cudafe++ does not write the id
        lambda t: t.replace(
            '"$CICC_PATH/cicc" --c++17 -arch compute_90 --module_id_file_name "d/k.module_id"', "cicc"
        ),
        lambda t: t.replace(
            'cicc" --c++17 -arch compute_90 --module_id_file_name "d/k', 'cicc" --module_id_file_name "e/k'
        ),
        lambda t: t + t.split("\n")[5] + "\n",  # a second cudafe++
        lambda t: t + "#$ ptxas late.ptx\n",  # device work after the last fatbinary
        lambda t: "\n".join(line for line in t.split("\n") if "cudafe++" not in line),  # e.g. --cubin, -E
        lambda t: "\n".join(line for line in t.split("\n") if "fatbinary" not in line),
        lambda t: t.replace("#$ cudafe++", "#$ touch d/x\n#$ cudafe++"),  # something else before cudafe++
    ],
)
def test_a_plan_of_another_shape_is_left_to_nvcc(edit):
    assert nvcc.plan(DRY_RUN) is not None
    assert nvcc.plan(edit(DRY_RUN)) is None


def test_a_module_id_is_the_command_s_and_stays_when_the_unit_or_its_folder_changes(tmp_path):
    a, b = tmp_path / "a" / "cuda.cu", tmp_path / "b" / "cuda.cu"
    for path, text in ((a, KERNEL), (b, KERNEL + "// edited\n")):
        path.parent.mkdir()
        path.write_text(text)
    first = nvcc.module_id(f"nvcc -c {a}", a, a.parent)
    assert first.isidentifier() and first.endswith("_cuda_cu_pkb")
    assert first == nvcc.module_id(f"nvcc -c {b}", b, b.parent)  # another text, another build folder
    assert first != nvcc.module_id(f"nvcc -O3 -c {a}", a, a.parent)
    assert first != nvcc.module_id(f"nvcc -DTORCH_EXTENSION_NAME=other -c {a}", a, a.parent)


def _symbols(obj: Path) -> list[str]:
    out = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(" ", 2)[-1] for line in out.splitlines() if line.strip())


def _fatbin_bytes(obj: Path) -> int:
    """The size of the object's `.nv_fatbin` section (the device code), 0 when it has none."""
    out = subprocess.run(["size", "-A", str(obj)], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.startswith(".nv_fatbin"))


@needs_nvcc
def test_the_split_compile_gives_nvcc_s_object(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    command = f"{NVCC} {ARCH} --compiler-options '-fPIC' -c k.cu -o split.o"
    assert nvcc.compile_unit(command, tmp_path, tmp_path / "k.cu", "split.o")
    subprocess.run(["/bin/sh", "-c", command.replace("split.o", "plain.o")], cwd=tmp_path, check=True)
    assert _symbols(tmp_path / "split.o") == _symbols(tmp_path / "plain.o")
    assert "add_one(float*, int)" in _symbols(tmp_path / "split.o")
    fatbin = _fatbin_bytes(tmp_path / "split.o")
    assert fatbin > 0 and fatbin == _fatbin_bytes(tmp_path / "plain.o")  # the device code is embedded
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".nvcc")] == []  # no scratch left


@needs_nvcc
def test_a_dependency_file_asked_for_names_what_nvcc_s_names(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    command = f"{NVCC} -MD -MF {{}}.d {ARCH} -c k.cu -o {{}}"
    assert nvcc.compile_unit(command.format("split.o", "split.o"), tmp_path, tmp_path / "k.cu", "split.o")
    subprocess.run(["/bin/sh", "-c", command.format("plain.o", "plain.o")], cwd=tmp_path, check=True)

    def rule(name: str) -> tuple[str, set[str]]:
        target, _, deps = (tmp_path / name).read_text().replace("\\\n", " ").partition(":")
        return target.strip(), set(deps.split())

    (target, split), (_, plain) = rule("split.o.d"), rule("plain.o.d")
    assert target == "split.o" and split == plain and "k.cu" in split
    assert any(d.endswith("/cuda_runtime.h") for d in split)


@needs_nvcc
def test_a_compile_error_is_reported_once_with_the_compiler_s_words(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL.replace("x[i] += 1.f;", "x[i] += undeclared_name;"))
    command = f"{NVCC} {ARCH} -c k.cu -o k.o"
    with pytest.raises(RuntimeError) as err:
        nvcc.compile_unit(command, tmp_path, tmp_path / "k.cu", "k.o")
    text = str(err.value)
    assert text.startswith("FAILED: k.o\n") and text.count('identifier "undeclared_name" is undefined') == 1
    assert not (tmp_path / "k.o").exists()


@needs_nvcc
def test_a_command_nvcc_plans_otherwise_is_not_split(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    assert not nvcc.compile_unit(f"{NVCC} {ARCH} -ptx k.cu -o k.ptx", tmp_path, tmp_path / "k.cu", "k.ptx")
    assert not (tmp_path / "k.ptx").exists()  # nothing ran: the caller runs the command itself


@needs_nvcc
def test_a_build_file_s_cuda_unit_goes_through_the_split_compile(tmp_path, monkeypatch):
    (tmp_path / "k.cu").write_text(KERNEL)
    steps = [
        objects.Step(
            "cuda_compile",
            "k.o",
            (str(tmp_path / "k.cu"),),
            f"{NVCC} -arch=sm_90 -c {tmp_path / 'k.cu'} -o k.o",
        ),
        objects.Step("link", "k.so", ("k.o",), "c++ -shared k.o -o k.so"),
    ]
    split: list[str] = []
    real = nvcc.compile_unit
    monkeypatch.setattr(nvcc, "compile_unit", lambda *a: split.append(a[3]) or real(*a))
    done = objects.run(steps, tmp_path, {"torch": "x"}, None, None, {})
    assert split == ["k.o"] and done.compiled == [str(tmp_path / "k.cu")]
    assert "add_one(float*, int)" in _symbols(tmp_path / "k.so")


def test_a_dry_run_line_is_split_as_the_shell_would_without_one():
    env = {"CICC_PATH": "/cuda/nvvm/bin", "FLAGS": " -a  -b "}
    assert words('"$CICC_PATH/cicc" -x "a b" \'c d\' e\\ f ${CICC_PATH}', env) == [
        "/cuda/nvvm/bin/cicc",
        "-x",
        "a b",
        "c d",
        "e f",
        "/cuda/nvvm/bin",
    ]
    assert words("gcc $FLAGS -c", env) == ["gcc", "-a", "-b", "-c"]
    assert words('gcc "" x') == ["gcc", "", "x"]


@pytest.mark.parametrize(
    "line",
    [
        'gcc "-DX=$(touch pwned)"',
        'gcc -D "Y=`touch pwned`"',
        "gcc -DX=`touch pwned`",
        "gcc -c k.cu && touch pwned",
        "gcc -c k.cu; touch pwned",
        "gcc -c k.cu | tee pwned",
        "gcc -c k.cu > pwned",
        "gcc $UNKNOWN",
        "gcc 'unclosed",
        "gcc *.cu",
    ],
)
def test_a_line_that_is_more_than_words_is_refused(line):
    with pytest.raises(NotPlain):
        words(line)


@needs_nvcc
def test_a_flag_with_a_command_substitution_is_never_run_by_a_shell(tmp_path):
    """nvcc prints `-DX=$(touch ...)` into its plan, and its own steps go through a shell: the split
    compile refuses such a plan (its caller is then the build, whose flags the host's grammar keeps
    plain), and planning it ran nothing."""
    (tmp_path / "k.cu").write_text(KERNEL)
    pwned = tmp_path / "pwned"
    for flag in (f"'-DX=$(touch {pwned})'", f"'-DY=`touch {pwned}`'", f"-Xcompiler '-DZ=$(touch {pwned})'"):
        command = f"{NVCC} {ARCH} {flag} -c k.cu -o k.o"
        assert nvcc._planned(command, tmp_path, tmp_path / "k.cu", nvcc._keep_dir(tmp_path, "k.o")) is None
        assert not pwned.exists()
