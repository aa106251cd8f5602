"""Extension builds one translation unit at a time, each unit's object cached by what enters its compiler.

`load_inline` writes two units: `main.cpp` (the C++ sources and the generated bindings, which
include all of `torch/extension.h`) and `cuda.cu` (the CUDA sources). An agent iterating on a kernel
edits only the second, yet torch's builder compiles both on every new request. Here torch still
writes the build file (`build.ninja`: its flags, its include paths, its link line), and this module
runs it: each compile step whose object is in the cache is copied from there, the others run side
by side (a CUDA unit's own front ends too: harness/nvcc.py), then the link.

An object's key is the sha256 of its unit's name and text, the request's fields that enter that
unit's command (everything but the other unit's sources) and the toolchain (harness/extensions.py
`unit_keys`): the command is torch's function of those, and the host computes the same keys from the
request alone, so that it installs into the node's cache only the objects of the units it asked a
build launch for (pkb_mcp/compile/extensions.py), whatever else the launch left. A step whose
dependency file names a header outside the toolchain's read-only roots (torch, Python, CUDA, /usr) is
compiled but never stored: its key would not cover what it read.

Every step runs as argv, never through a shell (harness/commands.py): a build file whose commands are
more than words for the shell is not run here. Only build launches store objects (into their launch
directory); a launch finds the objects it may use in its own view of the cache, read-only. A build file
this module does not understand (a rule it does not know, a variable it cannot expand) is left to
ninja itself, uncached, in a candidate's own launch only (harness/extensions.py `build`). Stdlib only:
this runs inside the sandbox.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import headers, nvcc, prefixes
from harness.commands import NotPlain, words

SCHEMA = 2
OBJECTS = "objects"  # the folder of objects in the node's extension cache and in a build launch
KEY_RE = re.compile(r"[0-9a-f]{64}\.o")
COMPILE_RULES = ("compile", "cuda_compile")
MAX_LOG_BYTES = 1 << 20
_VAR = re.compile(r"\$(\{(\w+)\}|(\w+)|\$|:| |\n)")


class PlanError(ValueError):
    """A build file this module does not run itself (ninja runs it instead)."""


@dataclass(frozen=True)
class Step:
    """One edge of the build file: its output, its inputs, its rule and the command it runs."""

    rule: str
    output: str
    inputs: tuple[str, ...]
    command: str


def _expand(text: str, scope: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        token = m.group(1)
        if token in ("$", ":", " "):
            return token
        if token == "\n":
            return ""
        name = m.group(2) or m.group(3)
        if name not in scope:
            raise PlanError(f"build file variable ${name} is not defined")
        return scope[name]

    return _VAR.sub(one, text)


def _paths(text: str) -> list[str]:
    """The paths of a build line's list (escaped spaces and colons kept)."""
    return [p.replace("$ ", " ").replace("$:", ":") for p in re.split(r"(?<!\$) +", text.strip()) if p]


def plan(build_file: Path) -> list[Step]:
    """The steps of a torch-written build file, in order: compiles first, the link last."""
    variables: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    steps: list[Step] = []
    current: dict[str, str] | None = None
    for raw in build_file.read_text().replace("$\n", "").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw.startswith(" "):
            if current is None:
                raise PlanError("an indented line outside a rule")
            name, _, value = raw.strip().partition("=")
            current[name.strip()] = value.strip()
            continue
        current = None
        if raw.startswith("rule "):
            current = rules.setdefault(raw[5:].strip(), {})
        elif raw.startswith("build "):
            outs, sep, rest = raw[6:].partition(": ")
            if not sep:
                raise PlanError(f"a build line without its rule: {raw[:80]}")
            rule, _, ins = rest.partition(" ")
            if rule not in rules or "|" in ins:
                raise PlanError(f"build rule {rule!r} or its inputs are not understood")
            inputs, outputs = _paths(ins), _paths(outs)
            if len(outputs) != 1:
                raise PlanError("a build step with several outputs")
            scope = {**variables, "in": " ".join(inputs), "out": outputs[0]}
            command = _expand(rules[rule]["command"], scope)
            try:
                words(command)
            except NotPlain as exc:
                raise PlanError(f"build step {outputs[0]} is not plain words for the shell: {exc}") from None
            steps.append(Step(rule, outputs[0], tuple(inputs), command))
        elif raw.startswith("default ") or raw.startswith("ninja_required_version"):
            continue
        else:
            name, sep, value = raw.partition("=")
            if not sep:
                raise PlanError(f"a line not understood: {raw[:80]}")
            variables[name.strip()] = _expand(value.strip(), variables)
    compiles = [s for s in steps if s.rule in COMPILE_RULES]
    if not steps or steps[-1].rule != "link" or len(compiles) != len(steps) - 1:
        raise PlanError("the build file is not compile steps then one link")
    return steps


def _roots() -> tuple[str, ...]:
    roots = {"/usr/", os.path.realpath(sys.prefix) + "/", os.path.realpath(sys.base_prefix) + "/"}
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots.add(os.path.realpath(os.environ[env]) + "/")
    return tuple(sorted(roots))


def object_key(unit: str, source: str, request: dict[str, object], toolchain: dict[str, str]) -> str:
    """The key of a unit's object: its file's name and text, the request's fields that enter its command
    (harness/extensions.py `unit_keys` chooses them), the toolchain. The host computes it too."""
    material = {"schema": SCHEMA, "unit": unit, "source": source, "request": request, "toolchain": toolchain}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _depends_only_on_toolchain(step: Step, directory: Path) -> bool:
    """Whether every file the compiler read (its dependency file) is the source or under a root."""
    try:
        text = (directory / (step.output + ".d")).read_text()
    except OSError:
        return False
    _, _, deps = text.replace("\\\n", " ").partition(":")
    roots, source = _roots(), os.path.realpath(step.inputs[0])
    for dep in deps.split():
        real = os.path.realpath(directory / dep)
        if real != source and not real.startswith(roots):
            return False
    return True


@dataclass
class Outcome:
    """What a build did: the units taken from the cache, those compiled, and those it stored; the
    seconds each compiled unit took (side by side) and the link's (LINK)."""

    cached: list[str]
    compiled: list[str]
    stored: list[str]
    seconds: dict[str, float] = field(default_factory=dict)
    precompiled: list[str] = field(default_factory=list)  # units compiled with torch's header precompiled
    parts: list[prefixes.Part] = field(default_factory=list)  # CUDA units' headers' parts (prefixes.py)
    chains: dict[str, dict[str, float]] = field(default_factory=dict)  # a CUDA unit's steps (nvcc.Split)


LINK = "(link)"


def _run(command: str, directory: Path, output_name: str) -> None:
    """One step as argv (never a shell: harness/commands.py); RuntimeError with its output if it fails."""
    try:
        argv = words(command)
    except NotPlain as exc:
        raise RuntimeError(f"FAILED: {output_name}\n{command}\nnot run: {exc}") from None
    proc = subprocess.run(argv, cwd=directory, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-MAX_LOG_BYTES:].decode("utf-8", errors="replace")
        raise RuntimeError(f"FAILED: {output_name}\n{command}\n{output}")


def _compile(
    step: Step,
    directory: Path,
    command: str | None,
    parts: Path | None,
    toolchain: dict[str, str],
) -> tuple[float, nvcc.Split | None]:
    """A CUDA unit through harness/nvcc.py (its front ends side by side, its headers' part precompiled
    where `parts` has it) where nvcc's plan allows, else `command` (the step's own, or it with a
    precompiled header: harness/headers.py); the seconds it took, and the split compile's account."""
    start = time.monotonic()
    source = Path(step.inputs[0])
    split = None
    if step.rule == "cuda_compile":
        split = nvcc.compile_unit(step.command, directory, source, step.output, parts, toolchain)
    if split is None:
        _run(command or step.command, directory, step.output)
    return round(time.monotonic() - start, 3), split


def run(
    steps: list[Step],
    directory: Path,
    toolchain: dict[str, str],
    cache: Path | None,
    store: Path | None,
    keys: dict[str, str] | None = None,
    header_key: str | None = None,
) -> Outcome:
    """Run a plan in `directory`: cached objects from `cache` (read-only), the other compile steps in
    parallel (a C++ unit with the precompiled header `header_key` where the cache holds it), objects
    of those whose dependencies the key covers written to `store`, then the link. `keys`: each unit's
    object key by its file's name (harness/extensions.py `unit_keys`); a unit without one is compiled
    and never stored. An object's key is the same with or without the header: its output is."""
    outcome = Outcome([], [], [])
    todo: list[tuple[Step, str | None]] = []
    for step in steps[:-1]:
        key = (keys or {}).get(Path(step.inputs[0]).name)
        hit = cache / f"{key}.o" if cache is not None and key is not None else None
        if hit is not None and hit.is_file() and not hit.is_symlink():
            shutil.copyfile(hit, directory / step.output)
            outcome.cached.append(step.inputs[0])
        else:
            todo.append((step, key))
    header_root = cache / headers.HEADERS if cache is not None else None
    part_root = cache / prefixes.PREFIXES if cache is not None else None
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(todo), 1)) as pool:
        futures = []
        for step, _ in todo:
            command = headers.command_with(step, header_root, header_key)
            if command is not None:
                outcome.precompiled.append(step.inputs[0])
            futures.append((step, pool.submit(_compile, step, directory, command, part_root, toolchain)))
        for step, future in futures:
            name = Path(step.inputs[0]).name
            outcome.seconds[name], split = future.result()
            if split is not None and split.part is not None:
                outcome.parts.append(split.part)
            if split is not None and split.seconds:
                outcome.chains[name] = split.seconds
    for step, key in todo:
        outcome.compiled.append(step.inputs[0])
        if store is not None and key is not None and _depends_only_on_toolchain(step, directory):
            store.mkdir(parents=True, exist_ok=True)
            part = store / f".{key}.o.part"
            shutil.copyfile(directory / step.output, part)
            os.replace(part, store / f"{key}.o")
            outcome.stored.append(step.inputs[0])
    start = time.monotonic()
    _run(steps[-1].command, directory, steps[-1].output)
    outcome.seconds[LINK] = round(time.monotonic() - start, 3)
    return outcome
