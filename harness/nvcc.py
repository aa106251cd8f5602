"""One nvcc compile with its host and device front ends side by side instead of one after the other.

nvcc compiles a `.cu` unit in two chains that each parse the whole unit: the host chain (the host
compiler's preprocessor, then `cudafe++`, which splits off the host code) and the device chain (the
preprocessor again, `cicc`, `ptxas`, `fatbinary`); the host compiler then compiles what `cudafe++`
wrote, with the device chain's fatbinary embedded. nvcc runs all of it in one line, although the device
chain needs only one thing from the host chain: the unit's module id, a name `cudafe++` writes to a
file for `cicc` to read. With a unit that includes ATen's headers, each front end takes many seconds
(docs/gpu-results.md, "Builds"), and `cicc` is most of the device chain.

Here the module id is written first (a name derived from the command, the build directory left out:
as unique as nvcc's), then the two chains run at once, then the host compile, with the headers' part
of its input precompiled where the node's cache has it (harness/prefixes.py; `make_part` makes one):
nvcc's own commands, taken from `nvcc -dryrun --keep` and run unchanged but for `cudafe++` reading the
id instead of writing it and, where nvcc was asked for a dependency file (`-MD -MF`, as torch's build
file asks), the preprocessor runs listing the files they read, from which that file is written as nvcc
would. A dry run whose commands do not have that shape (a flag that changes nvcc's plan in a way not
met before) is left to nvcc itself, so the result is always nvcc's. Every command runs as argv, never
through a shell: the dry run's lines are split by harness/commands.py, nvcc's variables taken from its
own assignments, and a line that is more than words (a backtick, `$(...)`, an operator) is never run:
the unit is then left to nvcc (whose flags the host's grammar has kept plain: pkb_mcp/compile/flags.py).
Stdlib only: this runs inside the sandbox, in build launches.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness import prefixes
from harness.commands import NotPlain, words

MAX_LOG_BYTES = 1 << 20
_ASSIGN = re.compile(r"([A-Za-z_]\w*)=(.*)")
_MODULE_ID = re.compile(r'--module_id_file_name "([^"]+)"')
_OUTPUT = re.compile(r' -o "([^"]+)"')
_DEPENDENCIES = re.compile(r"-- Filter Dependencies -- > (.+)")  # nvcc's own step for -MD/-MF
GEN_MODULE_ID = "--gen_module_id_file "


@dataclass(frozen=True)
class Plan:
    """nvcc's commands for one unit, grouped: the two chains that may run at once, then the rest."""

    env: dict[str, str]  # nvcc's variables (CICC_PATH, PATH, ...), which its commands refer to
    host: list[str]  # the host preprocessor and cudafe++, which reads `module_id` instead of writing it
    device: list[str]  # per architecture: preprocessor, cicc, ptxas; then fatbinary
    rest: list[str]  # the host compile of cudafe++'s output with the fatbinary
    module_id: str  # the module id file, relative to the working directory
    dependencies: str | None = None  # the dependency file nvcc was asked for (-MD -MF), if any


def _tool(command: str) -> str:
    first = command.split(" ", 1)[0].replace('"', "")
    return os.path.basename(first)


def _preprocesses(command: str) -> bool:
    return " -E " in command and _tool(command) not in ("cudafe++", "cicc", "ptxas", "fatbinary")


def plan(dry_run: str) -> Plan | None:
    """The plan of `nvcc ... -dryrun` output (its `#$ ` lines), or None when its commands do not have
    the shape this module knows: exactly one cudafe++ writing the module id, every cicc reading it,
    after it and before the last fatbinary, and nothing after that but the host compile."""
    env: dict[str, str] = {}
    commands: list[str] = []
    dependencies = None
    for line in dry_run.splitlines():
        if not line.startswith("#$ "):
            continue
        text = line[3:].strip()
        assign, wanted = _ASSIGN.fullmatch(text), _DEPENDENCIES.fullmatch(text)
        if wanted:
            dependencies = wanted.group(1).strip().strip('"')
        elif assign:
            env[assign.group(1)] = assign.group(2)
        elif text:
            commands.append(text)
    tools = [_tool(c) for c in commands]
    if tools.count("cudafe++") != 1 or "cicc" not in tools or "fatbinary" not in tools:
        return None
    split = tools.index("cudafe++")
    last_fatbinary = len(tools) - 1 - tools[::-1].index("fatbinary")
    frontend = commands[split]
    written = _MODULE_ID.search(frontend)
    if written is None or GEN_MODULE_ID not in frontend:
        return None
    module_id = written.group(1)
    before, device = commands[:split], commands[split + 1 : last_fatbinary + 1]
    rest = commands[last_fatbinary + 1 :]
    if "cicc" in tools[:split] or {"cicc", "cudafe++", "ptxas"} & {_tool(c) for c in rest}:
        return None
    if any(not _preprocesses(c) for c in before):
        return None
    for command in device:
        read = _MODULE_ID.search(command)
        if (read is None and _tool(command) == "cicc") or (read is not None and read.group(1) != module_id):
            return None
    # a preprocessor run whose output the device chain reads (nvcc may order it first) belongs to it
    feeds_device = [
        c for c in before if (out := _OUTPUT.search(c)) and any(out.group(1) in d for d in device)
    ]
    host = [c for c in before if c not in feeds_device] + [frontend.replace(GEN_MODULE_ID, "", 1)]
    return Plan(env, host, feeds_device + device, rest, module_id, dependencies)


def _with_dependencies(commands: list[str], keep: str, tag: str) -> tuple[list[str], list[str]]:
    """The commands with each preprocessor run also writing the files it read (gcc's -MD), and those
    dependency files' paths."""
    out: list[str] = []
    files: list[str] = []
    for command in commands:
        if _preprocesses(command):
            files.append(f"{keep}/deps-{tag}{len(files)}.d")
            command += f' -MD -MF "{files[-1]}"'
        out.append(command)
    return out, files


def _write_dependencies(cwd: Path, files: list[str], target: str, path: str) -> None:
    """One make rule, `target: every file any preprocessor run read`, as nvcc's -MD writes."""
    seen: dict[str, None] = {}
    for name in files:
        _, _, deps = (cwd / name).read_text().replace("\\\n", " ").partition(":")
        seen.update(dict.fromkeys(deps.split()))
    lines = [f"{target} :", *[f"    {dep}" for dep in seen]]
    (cwd / path).write_text(" \\\n".join(lines) + "\n")


def module_id(command: str, source: Path, directory: Path) -> str:
    """A module id for a unit: nvcc's form (a hash, then the file's name), from the command with the build
    directory left out: as nvcc's own is for one path, the same when only the unit's text changes (so its
    headers' part is too: harness/prefixes.py), and another for another extension's name or flags."""
    material = command.replace(str(directory), prefixes.BUILD)
    digest = hashlib.sha256(material.encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", source.name)
    return f"_{digest}_{len(stem)}_{stem}_pkb"


def _argv(commands: list[str], env: dict[str, str]) -> list[list[str]]:
    """Each command's argv, nvcc's variables from `env` (raises NotPlain for a line that is more)."""
    return [words(command, env) for command in commands]


@dataclass
class _Ran:
    """A chain's end: the first failing command's status (else 0) and every command's output."""

    returncode: int
    output: bytes


def _chain(commands: list[str], cwd: Path, env: dict[str, str]) -> _Ran:
    """The commands one after the other, as argv, up to the first that fails (as `a && b` would)."""
    output = b""
    for argv in _argv(commands, env):
        proc = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output += proc.stdout
        if proc.returncode != 0:
            return _Ran(proc.returncode, output)
    return _Ran(0, output)


def _failed(output_name: str, command: str, output: bytes) -> RuntimeError:
    text = output[-MAX_LOG_BYTES:].decode("utf-8", errors="replace")
    return RuntimeError(f"FAILED: {output_name}\n{command}\n{text}")


@dataclass(frozen=True)
class Split:
    """A unit compiled with its front ends side by side, and its headers' part (harness/prefixes.py)."""

    part: prefixes.Part | None = None
    seconds: dict[str, float] | None = None  # "host" and "device" (the chains, side by side), "compile"


def environment(steps: Plan) -> dict[str, str]:
    """What nvcc's commands run with: the sandbox's variables, then nvcc's own assignments, each read
    as the shell reads an assignment's value (quotes removed, earlier variables expanded); one that is
    not plain words keeps its text (no command refers to those)."""
    env = dict(os.environ)
    for name, value in steps.env.items():
        try:
            env[name] = " ".join(words(value, env)) if value.strip() else ""
        except NotPlain:
            env[name] = value
    return env


def _planned(command: str, cwd: Path, source: Path, keep: str) -> Plan | None:
    """nvcc's plan for `command`, its module id written, or None for a plan this module does not split
    (nor for one whose commands are more than words for the shell)."""
    try:
        argv = words(command)
    except NotPlain:
        return None
    dry = subprocess.run(
        [*argv, "-dryrun", "--keep", "--keep-dir", keep],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    steps = plan((dry.stdout + dry.stderr).decode("utf-8", errors="replace"))
    if dry.returncode != 0 or steps is None:
        return None
    env = environment(steps)
    try:
        _argv([*steps.host, *steps.device, *steps.rest], env)
    except NotPlain:
        return None
    (cwd / steps.module_id).write_text(module_id(command, source, cwd))
    return steps


def _keep_dir(cwd: Path, output_name: str) -> str:
    keep = f".nvcc-{re.sub(r'[^A-Za-z0-9_.-]', '_', output_name)}"
    shutil.rmtree(cwd / keep, ignore_errors=True)
    (cwd / keep).mkdir()
    return keep


def compile_unit(
    command: str,
    cwd: Path,
    source: Path,
    output_name: str,
    parts: Path | None = None,
    toolchain: dict[str, str] | None = None,
) -> Split | None:
    """Run nvcc's `command` (a shell line compiling `source` with `-c`) with its two front-end chains
    at once, the host compile with the headers' part precompiled where `parts` (the cache's, read-only)
    has it. None when nvcc's plan is not one this module splits (the caller runs `command` itself);
    raises RuntimeError with the compilers' output when the compile fails."""
    keep = _keep_dir(cwd, output_name)
    try:
        steps = _planned(command, cwd, source, keep)
        if steps is None:
            return None
        env = environment(steps)
        host, device, read = steps.host, steps.device, []
        if steps.dependencies is not None:
            host, read_host = _with_dependencies(host, keep, "host")
            device, read_device = _with_dependencies(device, keep, "device")
            read = read_host + read_device
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(_chain, host, cwd, env), pool.submit(_chain, device, cwd, env)]
            chains, seconds = [], {}
            for name, future in zip(("host", "device"), futures, strict=True):
                chains.append(future.result())
                # the device chain's time is the host chain's where it ended first
                seconds[name] = round(time.monotonic() - start, 3)
        for chain in chains:
            if chain.returncode != 0:  # the host chain's errors first: they are nvcc's first
                raise _failed(output_name, command, chain.output)
        used = prefixes.use(steps.rest, cwd, source, toolchain, parts) if toolchain is not None else None
        start = time.monotonic()
        last = _chain(used.rest if used is not None else steps.rest, cwd, env)
        part = used.part.after(last.output) if used is not None else None
        if last.returncode != 0 and used is not None and used.original is not None:
            part = used.undo(last.output)  # as nvcc would have compiled it, without the part
            last = _chain(steps.rest, cwd, env)
        seconds["compile"] = round(time.monotonic() - start, 3)
        if last.returncode != 0:
            raise _failed(output_name, command, last.output)
        if steps.dependencies is not None:
            _write_dependencies(cwd, read, output_name, steps.dependencies)
        return Split(part, seconds)
    finally:
        shutil.rmtree(cwd / keep, ignore_errors=True)


def make_part(
    command: str, cwd: Path, source: Path, output_name: str, toolchain: dict[str, str], out: Path
) -> str:
    """The unit's host chain alone, then its headers' part precompiled into `out`/<key>/
    (harness/prefixes.py `make`); the key. Raises RuntimeError when either fails."""
    keep = _keep_dir(cwd, output_name)
    try:
        steps = _planned(command, cwd, source, keep)
        if steps is None:
            raise RuntimeError("nvcc's plan for this unit is not one harness/nvcc.py splits")
        env = environment(steps)
        chain = _chain(steps.host, cwd, env)
        if chain.returncode != 0:
            raise _failed("part", command, chain.output)
        return prefixes.make(steps.rest, cwd, source, toolchain, out, env)
    finally:
        shutil.rmtree(cwd / keep, ignore_errors=True)
