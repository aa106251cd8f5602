"""Reading compiler output: nvcc/EDG, gcc/clang and tool messages into diagnostics; ptxas resource
reports into per-kernel resources; C++ names demangled.

Offers `parse_diagnostics`, `first_errors` (what a failed build's message leads with),
`parse_ptxas_resources` and `demangle`. Imports only pkb_mcp.compile.results."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from pkb_mcp.compile.results import Diagnostic, KernelResources, Severity, tool_message

_EDG_RE = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<sev>catastrophic error|internal error|error|warning)"
    r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$"
)


_GCC_RE = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
    r"(?P<sev>fatal error|error|warning): (?P<msg>.*)$"
)


_TOOL_RE = re.compile(
    r"^(?P<tool>nvcc|ptxas|nvlink|cicc|cudafe\+\+)\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$"
)


_PTXAS_LOC_RE = re.compile(
    r"^ptxas (?P<file>[^,]+), line (?P<line>\d+); (?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$"
)


_ENTRY_RE = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>\w+)'")


_PROPERTIES_RE = re.compile(r"Function properties for (?P<name>\S+)")


_FRAME_RE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
)


_USED_RE = re.compile(r"Used (?P<regs>\d+) registers")


def _severity(word: str) -> Severity:
    return "warning" if word == "warning" else "error"


def parse_diagnostics(output: str, *, tool: str) -> list[Diagnostic]:
    """nvcc (EDG front end), gcc-style and tool-level messages in compiler output, duplicates removed."""
    lines = output.splitlines()
    found: list[Diagnostic] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if m := _EDG_RE.match(line):
            block: list[str] = []
            while i < len(lines) and lines[i].strip() and not _is_header(lines[i]):
                block.append(lines[i])
                i += 1
            carets = [n for n, b in enumerate(block) if set(b.strip()) == {"^"}]
            details = block[: carets[0] - 1] + block[carets[0] + 1 :] if carets else block
            message = "\n".join([m["msg"], *(d.strip() for d in details[:6])])
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    severity=_severity(m["sev"]),
                    message=message,
                    code=m["code"],
                    tool=tool,
                )
            )
        elif m := _GCC_RE.match(line):
            message, code = m["msg"], None
            if flag := re.search(r" \[(-W[\w=+-]+)\]$", message):
                message, code = message[: flag.start()], flag.group(1)
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    column=int(m["col"]) if m["col"] else None,
                    severity=_severity(m["sev"]),
                    message=message,
                    code=code,
                    tool=tool,
                )
            )
        elif m := _PTXAS_LOC_RE.match(line):
            found.append(
                Diagnostic(
                    file=m["file"],
                    line=int(m["line"]),
                    severity=_severity(m["sev"]),
                    message=m["msg"],
                    tool="ptxas",
                )
            )
        elif m := _TOOL_RE.match(line):
            found.append(
                Diagnostic(file=None, severity=_severity(m["sev"]), message=m["msg"].strip(), tool=m["tool"])
            )
    unique = list({(d.file, d.line, d.column, d.severity, d.message): d for d in found}.values())
    return unique


# Where no compiler named a line: the linker's words, or any tool's "error: " (collect2's summary
# comes after the linker's cause, so the order written is kept)
_OTHER_ERROR_RE = re.compile(
    r"undefined reference to|undefined symbol|multiple definition of|cannot find -l|\berror: "
)


def first_errors(output: str, limit: int = 3) -> list[Diagnostic]:
    """The first errors of a build's output (nvcc, g++, ptxas, else the linker), in the order written,
    each file named without its directory (the build's directory means nothing to the user): what
    every failed build's message leads with. The rest of a torch build's log (its command lines, the
    ninja steps) is left out."""
    found = []
    for d in parse_diagnostics(output, tool="build"):
        if d.severity != "error":
            continue
        name = d.file.replace("\\", "/").rsplit("/", 1)[-1] if d.file else None
        tool = d.tool if d.tool != "build" else ("nvcc" if name and name.endswith((".cu", ".cuh")) else "c++")
        found.append(d.model_copy(update={"file": name, "tool": tool}))
    if not found:
        for line in output.splitlines():
            if _OTHER_ERROR_RE.search(line):
                text = line.strip().removeprefix("error: ")[:300]
                tool = "ld" if " ld" in line or "/ld:" in line else "build"
                found.append(tool_message(text, tool=tool))
    return found[:limit]


def _is_header(line: str) -> bool:
    return any(r.match(line) for r in (_EDG_RE, _GCC_RE, _TOOL_RE, _PTXAS_LOC_RE)) or line.startswith("ptxas")


def parse_ptxas_resources(output: str) -> list[KernelResources]:
    """Per-kernel resources from `ptxas -v` output (entry functions only, in the order ptxas lists them)."""
    kernels: dict[str, dict[str, int | str | None]] = {}
    current: str | None = None
    properties_of: str | None = None
    for line in output.splitlines():
        if m := _ENTRY_RE.search(line):
            current = m["name"]
            kernels.setdefault(current, {"arch": m["arch"]})
            properties_of = None
        elif m := _PROPERTIES_RE.search(line):
            properties_of = m["name"]
            if current is None:  # older ptxas: properties before (or without) the entry line
                current = properties_of
                kernels.setdefault(current, {"arch": ""})
        elif m := _FRAME_RE.search(line):
            if properties_of is not None and properties_of == current:
                entry = kernels[current]
                entry["stack"], entry["spill_st"], entry["spill_ld"] = (
                    int(m["stack"]),
                    int(m["st"]),
                    int(m["ld"]),
                )
        elif (m := _USED_RE.search(line)) and current is not None:
            entry = kernels[current]
            entry["regs"] = int(m["regs"])
            if b := re.search(r"used (\d+) barriers", line):
                entry["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                entry["smem"] = int(s.group(1))
            cmem = re.findall(r"(\d+) bytes cmem\[\d+\]", line)
            entry["cmem"] = sum(int(c) for c in cmem) if cmem else None
            if c := re.search(r"(\d+) bytes cumulative stack size", line):
                entry["cumulative"] = int(c.group(1))
    result = []
    for name, entry in kernels.items():
        if "regs" not in entry:
            continue

        def number(key: str, entry: dict[str, int | str | None] = entry) -> int:
            value = entry.get(key)
            return value if isinstance(value, int) else 0

        cmem_value, cumulative = entry.get("cmem"), entry.get("cumulative")
        result.append(
            KernelResources(
                kernel=name,
                mangled=name,
                arch=str(entry.get("arch") or ""),
                registers=number("regs"),
                shared_bytes=number("smem"),
                constant_bytes=cmem_value if isinstance(cmem_value, int) else None,
                stack_frame_bytes=number("stack"),
                spill_store_bytes=number("spill_st"),
                spill_load_bytes=number("spill_ld"),
                barriers=number("barriers"),
                cumulative_stack_bytes=cumulative if isinstance(cumulative, int) else None,
            )
        )
    return result


def demangle(names: Sequence[str]) -> dict[str, str]:
    """{mangled: demangled} by c++filt; empty when c++filt is missing or fails."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {}
    try:
        out = subprocess.run(
            [tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    demangled = out.stdout.splitlines()
    return dict(zip(names, demangled, strict=False)) if len(demangled) == len(names) else {}
