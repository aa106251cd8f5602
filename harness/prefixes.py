"""A CUDA unit's host compile with the headers' part of its text precompiled.

nvcc's last step compiles what `cudafe++` wrote, the unit's host code with every header expanded (13 MB
for a unit that includes `torch/types.h`, as `load_inline` makes every CUDA unit do), with the host
compiler, and parsing the headers is most of that step (docs/gpu-results.md, "Builds"). The text opens
with the headers' part, everything before the unit's own first line, which is the same for every unit
that includes the same headers with the same flags and module id (harness/nvcc.py `module_id`: the
command's, so it does not change when the kernel does). GCC precompiles that part as a header: a unit
whose part is in the node's cache is compiled as `#include "<cache>/prefixes/<key>/prefix.h"` followed by
its own lines; GCC finds `prefix.h.gch` beside it and uses it where the flags suit, or else reads
`prefix.h`, the same text, so the object is the same either way.

A part's key: sha256 of the schema, the host compile's arguments less its input and output, the part's
text (the build directory written as `<build>` in both) and the toolchain. The part is made by a build
launch of its own (harness/build.py `make_part`: the unit's host chain again, then `-x c++-header`)
into the launch's `prefixes/<key>/`, which the host copies into the node's cache
(pkb_mcp/compile/headers.py); builds find it there, read-only. Stdlib only: runs inside the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.commands import NotPlain, words

SCHEMA = 1
PREFIXES = "prefixes"  # the folder of parts under the node's object cache, and in a build launch
HEADER = "prefix.h"
BUILD = "<build>"
MIN_PART_BYTES = 1 << 16  # a smaller part is not worth a header of hundreds of MB
MAX_LOG_BYTES = 1 << 20
_INPUT = re.compile(r".+\.cudafe1\.cpp")
INVALID = "[-Winvalid-pch]"  # how GCC marks its reason for not taking a precompiled header


@dataclass(frozen=True)
class HostCompile:
    """The host compile of `cudafe++`'s output, as nvcc's plan runs it."""

    argv: list[str]
    source: int  # the index of cudafe++'s output in argv
    output: int  # the index of the object's name in argv

    def flags(self, directory: Path) -> list[str]:
        """What of the command a header must share: all but the input and the output."""
        kept = [a for i, a in enumerate(self.argv) if i not in (self.source, self.output, self.output - 1)]
        return [a.replace(str(directory), BUILD) for a in kept]


@dataclass(frozen=True)
class Part:
    """A unit's headers' part: its key, and whether its host compile used it precompiled (the cache had
    it, and GCC took it: `rejected`, the reason GCC gave where it did not)."""

    key: str
    precompiled: bool
    rejected: str = ""

    def after(self, output: bytes) -> Part:
        """The part as the host compile's output (with -Winvalid-pch) tells of it."""
        said = output.decode("utf-8", errors="replace")
        if not self.precompiled or INVALID not in said:
            return self
        line = next(line for line in said.splitlines() if INVALID in line)
        return Part(self.key, False, line[-300:])


def host_compile(rest: list[str]) -> HostCompile | None:
    """The host compile of a plan's last commands (harness/nvcc.py `Plan.rest`), or None when they are not
    one compile of `cudafe++`'s output with `-o`."""
    if len(rest) != 1:
        return None
    try:
        argv = words(rest[0])  # no variables: one of nvcc's would be refused (NotPlain)
    except NotPlain:
        return None
    sources = [i for i, a in enumerate(argv) if _INPUT.fullmatch(a)]
    outputs = [i + 1 for i, a in enumerate(argv[:-1]) if a == "-o"]
    if len(sources) != 1 or len(outputs) != 1 or "-c" not in argv or "$" in rest[0]:
        return None  # ($: a variable of nvcc's, which this module would not expand as its shell does)
    return HostCompile(argv, sources[0], outputs[0])


def split(text: str, unit: Path) -> int | None:
    """Where the unit's own lines start in `cudafe++`'s output: the first line marker back in the unit
    after its opening one (its includes before it); None when the headers' part is too small to keep."""
    marker = re.compile(rf'^# \d+ "{re.escape(str(unit))}"( \d)*$', re.MULTILINE)
    opening = marker.search(text)
    own = marker.search(text, opening.end()) if opening is not None else None
    if own is None or own.start() < MIN_PART_BYTES:
        return None
    return own.start()


def key(flags: list[str], part: str, toolchain: dict[str, str]) -> str:
    material = {"schema": SCHEMA, "flags": flags, "part": part, "toolchain": toolchain}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _part(
    compile_: HostCompile, directory: Path, unit: Path, toolchain: dict[str, str]
) -> tuple[str, str, str, str] | None:
    """The key, the normalized headers' part, the unit's own lines and the whole of cudafe++'s output."""
    path = directory / compile_.argv[compile_.source]
    try:
        text = path.read_text(errors="surrogateescape")
    except OSError:
        return None
    at = split(text, unit)
    if at is None:
        return None
    part = text[:at].replace(str(directory), BUILD)
    return key(compile_.flags(directory), part, toolchain), part, text[at:], text


@dataclass(frozen=True)
class Use:
    """What `use` made of a unit's host compile: its part, the compile to run, and where `cudafe++`'s
    output was rewritten to include the part, its own text (to compile without the part after all)."""

    part: Part
    rest: list[str]
    original: tuple[Path, str] | None = None

    def undo(self, failed: bytes) -> Part:
        """Put `cudafe++`'s output back as it was, after a compile with the part failed (`failed`, its
        output): the part as then reported."""
        if self.original is not None:
            path, text = self.original
            path.write_text(text, errors="surrogateescape")
        reason = failed.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return Part(self.part.key, False, f"the compile with it failed: {reason[0][-250:]}")


def use(
    rest: list[str], directory: Path, unit: Path, toolchain: dict[str, str], root: Path | None
) -> Use | None:
    """Before the host compile: the unit's part and the compile to run (`rest`, or where `root`, the
    cache's parts, read-only, has the part precompiled, `rest` with -Winvalid-pch after `cudafe++`'s
    output has been rewritten to include it). None: no part to speak of."""
    compile_ = host_compile(rest)
    found = _part(compile_, directory, unit, toolchain) if compile_ is not None else None
    if compile_ is None or found is None:
        return None
    part_key, _, own, text = found
    header = root / part_key / HEADER if root is not None else None
    if header is None or not _plain(header) or not _plain(header.with_name(HEADER + ".gch")):
        return Use(Part(part_key, False), rest)
    path = directory / compile_.argv[compile_.source]
    path.write_text(f'#include "{header}"\n{own}', errors="surrogateescape")
    argv = [compile_.argv[0], "-Winvalid-pch", *compile_.argv[1:]]
    return Use(Part(part_key, True), [shlex.join(argv)], (path, text))


def make(
    rest: list[str], directory: Path, unit: Path, toolchain: dict[str, str], out: Path, env: dict[str, str]
) -> str:
    """After a unit's host chain: write its part into `out`/<key>/ and precompile it; the key. Raises
    RuntimeError with the compiler's output when the part has none or does not compile."""
    compile_ = host_compile(rest)
    found = _part(compile_, directory, unit, toolchain) if compile_ is not None else None
    if compile_ is None or found is None:
        raise RuntimeError("the unit's host compile has no headers' part to precompile")
    part_key, part, _, _ = found
    folder = out / part_key
    folder.mkdir(parents=True, exist_ok=True)
    header = folder / HEADER
    header.write_text(part, errors="surrogateescape")
    argv = list(compile_.argv)
    argv[compile_.source], argv[compile_.output] = str(header), str(header) + ".gch"
    argv = ["c++-header" if a == "c++" and argv[i - 1] == "-x" else a for i, a in enumerate(argv)]
    proc = subprocess.run(
        argv, cwd=directory, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False
    )
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-MAX_LOG_BYTES:].decode("utf-8", errors="replace")
        raise RuntimeError(f"FAILED: {HEADER}.gch\n{shlex.join(argv)}\n{output}")
    return part_key


def _plain(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()
