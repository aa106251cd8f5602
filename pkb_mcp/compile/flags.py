"""Flags a solution passes (extra_cuda_cflags / extra_cflags): an allow-list, because a flag such as
-ccbin, --run, -Xcompiler -B, -fplugin or -specs would let candidate code choose which program runs in a
build. The same list decides which extension requests may be built for the shared extension cache.

It is a grammar as well as a list: nvcc runs its own steps through a shell (a `-DX=$(...)` there runs a
program even where nvcc itself was started as argv), so no flag kept may hold a character a shell reads.
A macro is `NAME` or `NAME=value` (a value of letters, digits and `_.+-`), a path letters, digits and
`_./+-`, and every flag kept, whatever its form, only letters, digits and `_=+,.:/%@-` (PLAIN, the
same set the build launch checks again: harness/extensions.py `SAFE_FLAG`).

Offers `choose_nvcc_flags` and `choose_host_flags` (a `FlagChoice`: the flags kept, those dropped, whether
the solution chose its own language standard) and `prebuild_refusal`. Imports nothing of pkb_mcp."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# fmt: off
_NVCC_TAKES_VALUE = frozenset((
    "-Xptxas", "--ptxas-options", "-Xcompiler", "--compiler-options", "-Xcudafe", "-maxrregcount",
    "--maxrregcount", "-I", "--include-path", "-isystem", "-D", "--define-macro", "-U", "--undefine-macro",
    "-diag-suppress", "--diag-suppress", "--default-stream", "-default-stream", "-rdc",
    "--relocatable-device-code", "-std", "--std", "-arch", "--gpu-architecture", "-gencode",
    "--generate-code", "-code", "--gpu-code", "-o", "--output-file", "-ccbin", "--compiler-bindir", "-x",
    "--x", "-include", "--pre-include", "-Xlinker", "--linker-options", "-Xnvlink", "-Xarchive", "-odir",
    "--run-args", "-ftz", "--ftz", "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad",
    "--fmad",
))


_NVCC_SWITCHES = frozenset((
    "-use_fast_math", "--use_fast_math", "-lineinfo", "--generate-line-info", "-G", "--device-debug", "-g",
    "--debug", "--expt-relaxed-constexpr", "-expt-relaxed-constexpr", "--expt-extended-lambda",
    "-expt-extended-lambda", "--extended-lambda", "-extended-lambda", "-w", "--disable-warnings",
    "-restrict", "--restrict", "-Wno-deprecated-gpu-targets", "-Wno-deprecated-declarations",
    "-Werror=all-warnings", "--resource-usage", "-res-usage", "-v",
))


_NVCC_VALUED_OK = frozenset((
    "-Xptxas", "--ptxas-options", "-Xcudafe", "-maxrregcount", "--maxrregcount", "-diag-suppress",
    "--diag-suppress", "--default-stream", "-default-stream", "-rdc", "--relocatable-device-code", "-std",
    "--std", "-ftz", "--ftz", "-prec-div", "--prec-div", "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad",
    "-D", "--define-macro", "-U", "--undefine-macro",
))


_NVCC_PATH_FLAGS = frozenset(("-I", "--include-path", "-isystem", "-include", "--pre-include"))


# fmt: on
# Options forwarded to ptxas / cudafe that only change code generation or messages (no file names).
_PTXAS_ITEM_RE = re.compile(
    r"-{1,2}(v|verbose|O[0-3]|warn-spills|warn-on-spills|warn-lmem-usage|warn-on-local-memory-usage|"
    r"warn-double-usage|w|disable-warnings|Werror|warning-as-error|lineinfo|generate-line-info|"
    r"(dlcm|dscm|def-load-cache|def-store-cache|fmad|maxrregcount|allow-expensive-optimizations)=\w+|"
    r"allow-expensive-optimizations|disable-optimizer-constants|suppress-stack-size-warning)"
)


_CUDAFE_ITEM_RE = re.compile(r"-{1,2}(diag[_-](suppress|warning|error|remark)=[\w,-]+|display_error_number)")


_ARCH_FLAG_RE = re.compile(
    r"(-gencode[= ]arch=compute_\d+[af]?,code=(sm|compute)_\d+[af]?|-arch[= ]sm_\d+[af]?|--use_fast_math)"
)


_MACRO = r"[A-Za-z_][A-Za-z0-9_]*"
_DEFINE_RE = re.compile(rf"{_MACRO}(=[A-Za-z0-9_.+-]*)?")
_MACRO_RE = re.compile(_MACRO)
_PATH_RE = re.compile(r"[A-Za-z0-9_./+-]+")
PLAIN = re.compile(r"[A-Za-z0-9_=+,.:/%@-]+")  # what any kept flag is made of: nothing a shell reads
SHELL_READS = "`$;|&<>\"'()\\ \t\n*?[]{}~#!"

_HOST_FLAG_RE = re.compile(
    rf"-(O[0-3sgz]?|Ofast|W(?!l$|p$|a$|l,|p,|a,)[\w=+-]*|w|D{_MACRO}(=[A-Za-z0-9_.+-]*)?|U{_MACRO}|"
    r"f(?!plugin)[\w=+.-]+|m[\w=.-]+|std=[\w+]+|g\d?|pthread|fopenmp|fPIC)",
    re.ASCII,
)


@dataclass
class FlagChoice:
    """What an allow-list made of a solution's flags: those passed on, those left out, and whether one sets
    the language standard (so the default is not added)."""

    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    user_std: bool = False


def choose_nvcc_flags(flags: Sequence[str], base: Path) -> FlagChoice:
    """The nvcc flags that pass the allow-list; path values are taken relative to `base`."""
    choice = FlagChoice()
    i = 0
    while i < len(flags):
        token = flags[i]
        i += 1
        name, value = token, None
        if token in _NVCC_TAKES_VALUE and i < len(flags):
            value = flags[i]
            i += 1
        elif token[:2] in ("-I", "-D", "-U", "-O") and len(token) > 2:
            name, value = token[:2], token[2:]
        elif token.startswith("-") and "=" in token:
            name, value = token.split("=", 1)
        if name in _NVCC_SWITCHES and value is None:
            choice.kept.append(name)
        elif name == "-O" and value in ("0", "1", "2", "3"):
            choice.kept.append(f"-O{value}")
        elif name in ("-D", "--define-macro") and value is not None and _DEFINE_RE.fullmatch(value):
            choice.kept.append("-D" + value)
        elif name in ("-U", "--undefine-macro") and value is not None and _MACRO_RE.fullmatch(value):
            choice.kept.append("-U" + value)
        elif name in ("-D", "--define-macro", "-U", "--undefine-macro"):
            choice.dropped.append(token if value is None or token.endswith(value) else f"{token} {value}")
        elif name in ("-Xptxas", "--ptxas-options", "-Xcudafe") and value is not None:
            pattern = _CUDAFE_ITEM_RE if name == "-Xcudafe" else _PTXAS_ITEM_RE
            if all(pattern.fullmatch(item) for item in value.split(",") if item):
                choice.kept += [name, value]
            else:
                choice.dropped.append(f"{name} {value}")
        elif name in _NVCC_VALUED_OK and value is not None and re.fullmatch(r"[\w+.,=-]+", value, re.ASCII):
            choice.kept += [name, value]
            choice.user_std |= name in ("-std", "--std")
        elif name in _NVCC_PATH_FLAGS and value is not None and _PATH_RE.fullmatch(value):
            choice.kept += [name, str(base / value)]
        elif name in ("-Xcompiler", "--compiler-options") and value is not None:
            items = [item for item in value.split(",") if item]
            if items and all(_HOST_FLAG_RE.fullmatch(item) for item in items):
                choice.kept += [name, value]
            else:
                choice.dropped.append(f"{name} {value}")
        else:
            choice.dropped.append(token if value is None or "=" in token else f"{token} {value}")
    return _plain_only(choice)


def _plain_only(choice: FlagChoice) -> FlagChoice:
    """The choice with any kept flag that holds a character a shell reads moved to the dropped ones (the
    patterns above admit none; this is what makes sure of it: harness/extensions.py checks again)."""
    kept = [f for f in choice.kept if PLAIN.fullmatch(f)]
    choice.dropped += [f for f in choice.kept if not PLAIN.fullmatch(f)]
    choice.kept = kept
    return choice


def shell_character(flag: str) -> str | None:
    """The first character of `flag` that a shell reads (SHELL_READS, or any not ASCII), or None."""
    return next((c for c in flag if c in SHELL_READS or not c.isascii() or not c.isprintable()), None)


def choose_host_flags(flags: Sequence[str], base: Path) -> FlagChoice:
    """The host compiler flags that pass the allow-list; path values are taken relative to `base`."""
    choice = FlagChoice()
    i = 0
    while i < len(flags):
        token = flags[i]
        i += 1
        if token in ("-I", "-isystem", "-include") and i < len(flags):
            if _PATH_RE.fullmatch(flags[i]):
                choice.kept += [token, str(base / flags[i])]
            else:
                choice.dropped.append(f"{token} {flags[i]}")
            i += 1
        elif token.startswith("-I") and len(token) > 2 and _PATH_RE.fullmatch(token[2:]):
            choice.kept.append("-I" + str(base / token[2:]))
        elif _HOST_FLAG_RE.fullmatch(token):
            choice.kept.append(token)
            choice.user_std |= token.startswith("-std=")
        else:
            choice.dropped.append(token)
    return _plain_only(choice)


def prebuild_refusal(request: Any) -> str | None:
    """Why a load_inline request may not be built for the shared extension cache, or None.

    A build launch runs no candidate code only if the compilers run no program the candidate chose: its
    flags must pass the same allow-list as compile_kernel's, with no paths, and link only libraries
    by name."""
    base = Path("/nonexistent")
    host = choose_host_flags(request.extra_cflags, base)
    nvcc = choose_nvcc_flags([f for f in request.extra_cuda_cflags if not _ARCH_FLAG_RE.fullmatch(f)], base)
    dropped = host.dropped + nvcc.dropped
    dropped += [f for f in (*host.kept, *nvcc.kept) if str(base) in f]
    dropped += [f for f in request.extra_ldflags if not re.fullmatch(r"-l[\w.+-]+", f, re.ASCII)]
    if dropped:
        flag = dropped[0]
        given = (*request.extra_cflags, *request.extra_cuda_cflags, *request.extra_ldflags)
        # a dropped "name value" pair is two flags of the request joined by one blank: not the flag's
        char = next((c for part in flag.split(" ") if (c := shell_character(part))), None)
        char = char or (" " if flag in given and " " in flag else None)
        if char is not None:
            return (
                f"flag {flag[:80]!r} holds {char!r}, a character a shell reads: a flag may hold only "
                "letters, digits and _=+,.:/%@- (a macro: NAME or NAME=value of letters, digits and _.+-)"
            )
        return f"flag {flag[:80]!r} is not on the allow-list for shared builds"
    return None
