"""A precompiled `torch/extension.h` for the C++ unit of extension builds.

`load_inline`'s `main.cpp` opens with `#include <torch/extension.h>` (all of torch's C++ API and
pybind11; with `no_implicit_headers` the C++ source as given, which may open with blank or comment
lines first), and parsing it is most of that unit's compile: about 35 s on a 2-core machine, 8 s with a
precompiled header (the same object, symbol for symbol). GCC looks for `torch/extension.h.gch` in
each include directory before the header itself and uses it for a unit's first `#include` where the
flags it was made with suit the compile; otherwise it reads the header beside it, a stub that
includes torch's own (`stub_text`): the result is the same either way.

A header is keyed by what decides its compile: the request's flag set (`extra_cflags` and whether it
builds with CUDA: torch's build file makes the C++ unit's flags of these, and of the extension's name,
which the header never reads) and the toolchain, so that the host computes the key from the request
and installs only the header it asked for. It is made by a build launch that holds no candidate
source (harness/build.py `make_header`: the host asks for one per set of a request's allow-listed
flags), and found by later builds in their view of the cache, read-only (`command_with`); GCC
takes it only where the unit's flags suit it, so the object is the same either way. `pkb compile`'s
syntax check of a C++ source (`-fsyntax-only` with a build's code model) takes the same header
(`argv_with`: harness/build.py). Stdlib only: runs inside the sandbox.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class Step(Protocol):  # harness/objects.py's Step, as far as this module reads it
    @property
    def rule(self) -> str: ...
    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def command(self) -> str: ...


SCHEMA = 2
HEADERS = "headers"  # the folder of headers under the node's object cache, and in a build launch
HEADER = "torch/extension.h"
OPENING = "#include <torch/extension.h>"  # what load_inline writes first in main.cpp
MAX_OPENING_LINES = 64  # blank and comment lines read before a source's opening
_DROPPED_WITH_VALUE = ("-MF", "-c", "-o")
_DROPPED = ("-MMD", "-MD")


def flags(step: Step) -> list[str] | None:
    """The C++ unit's compiler and flags that a header made for it must share, or None for a step
    that cannot use one (not a C++ compile, a source that does not open with torch's header)."""
    if step.rule != "compile" or not step.inputs:
        return None
    try:
        with open(step.inputs[0], errors="replace") as f:
            if _opening(f) != OPENING:
                return None
        argv = shlex.split(step.command)
    except (OSError, ValueError):
        return None
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _DROPPED_WITH_VALUE:
            skip = True
        elif arg not in _DROPPED and not arg.startswith("-DTORCH_EXTENSION_NAME="):
            kept.append(arg)
    return kept if len(kept) > 1 and "-c" in argv and "-o" in argv else None


def _opening(lines: Iterable[str]) -> str:
    """A source's first line that is neither blank nor a `//` comment (GCC takes a precompiled header
    for an `#include` before the unit's first token: `load_inline` with `no_implicit_headers` writes
    the C++ sources as given, which often open with a blank line)."""
    for line in itertools.islice(lines, MAX_OPENING_LINES):
        text = line.strip()
        if text and not text.startswith("//"):
            return text
    return ""


def key(extra_cflags: list[str], with_cuda: bool, toolchain: dict[str, str]) -> str:
    """A flag set's header key (harness/extensions.py `header_key` for a request): the host's too."""
    material = {"schema": SCHEMA, "extra_cflags": list(extra_cflags), "with_cuda": bool(with_cuda)}
    return hashlib.sha256(
        json.dumps({**material, "toolchain": toolchain}, sort_keys=True).encode()
    ).hexdigest()


def path(root: Path, header_key: str) -> Path:
    """Where a header of this key lies under `root` (a cache's or a launch's headers folder)."""
    return root / header_key / f"{HEADER}.gch"


def stub_text(real: Path) -> str:
    """What lies beside a precompiled header as `torch/extension.h`: GCC reads the file beside the
    `.gch` where it does not use it (a second `#include` of the header, flags it does not suit), so
    that file includes torch's own (whose `#pragma once` the precompiled state keeps)."""
    return f'#include "{real}"\n'


def command_with(step: Step, root: Path | None, header_key: str | None) -> str | None:
    """The step's command finding the precompiled header `header_key` (its request's flag set's) in
    `root`, or None when there is none or the step cannot use one."""
    if flags(step) is None:
        return None
    argv = argv_with(shlex.split(step.command), root, header_key)
    return shlex.join(argv) if argv is not None else None


def argv_with(argv: list[str], root: Path | None, header_key: str | None) -> list[str] | None:
    """A compiler's arguments finding the precompiled header `header_key` in `root` (its folder first
    on the include path), or None where `root` has no such header with its stub beside it. Also for
    the syntax check of a solution's C++ source (pkb_mcp/compile/solution.py), whose flags are a
    build's C++ unit's with `-fsyntax-only`."""
    if root is None or header_key is None or not argv:
        return None
    found = path(root, header_key)
    beside = found.with_suffix("")  # the stub, for what does not use the header
    if not found.is_file() or found.is_symlink() or not beside.is_file() or beside.is_symlink():
        return None
    return [argv[0], f"-I{found.parent.parent}", *argv[1:]]
