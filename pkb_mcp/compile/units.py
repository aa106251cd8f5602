"""One unit (a .cu file, or one extension of a solution): its compiler commands, run in a build launch in the
sandbox (harness/build.py) or taken from the cache, and the diagnostics and kernel resources of their
output, mapped back to the lines the user wrote.

Offers the plan of a unit (`UnitPlan` of `Command`s, a `LineMap` for sources load_inline would generate,
`command_material` to key a command in the cache, `safe_identifier` for an extension's name), `run_plans`
(cached or in one build launch, with the extension builds that share it), `unit_result` (a `CompileUnit`
from the runs' `CommandRecord`s) and `time_left`. Imports pkb_mcp.compile.cache, extensions, parse and
results."""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from pkb_mcp.compile.cache import Cache, read_source
from pkb_mcp.compile.extensions import Prepared, ToolRunner, build_requests
from pkb_mcp.compile.headers import header_files
from pkb_mcp.compile.parse import demangle, parse_diagnostics, parse_ptxas_resources
from pkb_mcp.compile.results import CompileUnit, Diagnostic, KernelResources, tool_message
from pkb_mcp.extension_view import show_entries

_MAX_DIAGNOSTICS_PER_UNIT = 50


_MAX_CAPTURED_OUTPUT = 1 << 20


_LOG_LIMIT = 4096  # characters of a unit's compiler log kept in its result


PCH_REFUSED = "-Winvalid-pch"  # GCC's warning where it does not take a precompiled header


@dataclass
class LineMap:
    """Maps lines of a file that load_inline would generate back to the user's strings and the .py file."""

    generated: str
    prefix_lines: int
    chunks: list[str]
    py_lines: list[str]
    py_display: str
    pseudo_name: str
    offsets: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.offsets = [_locate_chunk(chunk, self.py_lines) for chunk in self.chunks]

    def map(self, line: int) -> tuple[str, int]:
        index = line - self.prefix_lines - 1
        if index < 0:
            return self.pseudo_name, line
        for n, chunk in enumerate(self.chunks):
            count = chunk.count("\n") + 1
            if index < count:
                offset = self.offsets[n]
                if offset is not None:
                    return self.py_display, offset + index + 1
                label = f"{self.pseudo_name}[{n}]" if len(self.chunks) > 1 else self.pseudo_name
                return label, index + 1
            index -= count
        return self.pseudo_name, line


def _locate_chunk(chunk: str, py_lines: Sequence[str]) -> int | None:
    """0-based .py line index of the chunk's first line, or None where the text cannot be found.

    Anchors on the chunk's longest line (its first non-empty line ties), then keeps the placement where the
    most chunk lines equal the .py lines (escapes in a non-raw string may spoil a few lines, not most)."""
    chunk_lines = [line.strip() for line in chunk.split("\n")]
    non_empty = [(n, text) for n, text in enumerate(chunk_lines) if text]
    if not non_empty:
        return None
    anchor_n, anchor = max(non_empty, key=lambda item: (len(item[1]), -item[0]))
    stripped = [line.strip() for line in py_lines]
    best: tuple[int, int] | None = None
    for i, py_line in enumerate(stripped):
        if anchor not in py_line:
            continue
        offset = i - anchor_n
        score = 0
        for n, text in non_empty:
            j = offset + n
            if 0 <= j < len(stripped) and (
                stripped[j] == text or (text in stripped[j] and n in (0, anchor_n))
            ):
                score += 1
        if best is None or score > best[1]:
            best = (offset, score)
    if best is None or best[1] * 2 < len(non_empty):
        return None
    return best[0]


@dataclass
class Command:
    """One compiler run of a unit."""

    tool: Literal["nvcc", "c++"]
    argv: list[str]
    key_material: dict[str, object]  # what decides the compiler's output, besides the toolchain
    line_map: LineMap | None = None
    paths: dict[str, str] = field(default_factory=dict)  # compiler path -> name shown to the user
    # a C++ syntax check: the key of torch's precompiled header it may use (compile/headers.py
    # check_key); the result is the same without it, so it is no part of the key material
    header: str | None = None


@dataclass
class UnitPlan:
    """A unit's compiler runs, planned in its own folder of the build launch."""

    name: str
    commands: list[Command]
    work: Path
    toolchain: dict[str, str]
    inputs: dict[str, str] = field(default_factory=dict)  # files read besides the .py: {path: sha256}
    diagnostics: list[Diagnostic] = field(default_factory=list)  # known before building


class CommandRecord(BaseModel):
    """A compiler run as cached: its exit status and output, with the build dir written as <build>."""

    returncode: int | None
    output: str
    elapsed_s: float
    header: bool | None = None  # offered torch's precompiled header: whether GCC took it


def command_material(
    tool: str, argv: Sequence[str], work: Path, source: Path, deps: dict[str, str]
) -> dict[str, object]:
    """What decides a compiler run's output, besides the toolchain: its cache key material."""
    return {
        "level": "command",
        "tool": tool,
        "argv": _shown(argv, work),
        "source": read_source(str(source)),
        "deps": deps,
    }


def safe_identifier(name: str) -> str:
    """An extension name as a C identifier (TORCH_EXTENSION_NAME)."""
    ident = re.sub(r"\W", "_", name) or "extension"
    return f"_{ident}" if ident[0].isdigit() else ident


def time_left(deadline: float) -> float:
    """Seconds until `deadline` (time.monotonic), never quite zero."""
    return max(deadline - time.monotonic(), 0.01)


def run_plans(
    plans: Sequence[UnitPlan],
    cache: Cache,
    tools: ToolRunner,
    work: Path,
    deadline: float,
    prebuild: Sequence[Any] = (),
) -> tuple[list[list[tuple[CommandRecord | None, bool]]], Prepared]:
    """Each plan's compiler runs: from the cache, or from one build launch in `work` (the launch directory
    the plans wrote their sources into), which also builds `prebuild` extension requests. Returns per
    plan [(record or None when the launch left none, cache hit)], and what the extension builds did."""
    keyed = []
    for plan in plans:
        row = []
        for command in plan.commands:
            key = (
                cache.key({**command.key_material, "toolchain": plan.toolchain})
                if command.key_material
                else ""
            )
            row.append((key, cache.load(key, CommandRecord) if key else None))
        keyed.append(row)
    pending = [(p, j) for p, row in enumerate(keyed) for j, (_, record) in enumerate(row) if record is None]
    commands = [_planned(plans[p].commands[j], plans[p].work) for p, j in pending]
    if tools.isolated:  # a view's files are the cache's own: only a sandbox's user cannot change them
        keys = {c["header"] for c in commands if "header" in c}
        show_entries(work, [e for key in sorted(keys) for e in header_files(key)])
    prepared, result = build_requests(
        list(prebuild), tools, time_left(deadline), extra={"commands": commands}, launch_dir=work
    )
    ran = result.get("commands", []) if result is not None else []
    ran = ran if isinstance(ran, list) else []
    out: list[list[tuple[CommandRecord | None, bool]]] = [
        [(r, r is not None) for _, r in row] for row in keyed
    ]
    for n, (p, j) in enumerate(pending):
        record = _parse_record(ran[n]) if n < len(ran) else None
        if record is not None:  # the launch wrote its directory as <build>; a unit's record names its own
            output = record.output.replace("<build>", str(work)).replace(str(plans[p].work), "<build>")
            record = record.model_copy(update={"output": output})
        out[p][j] = (record, False)
        key = keyed[p][j][0]
        finished = record is not None and record.returncode is not None and 0 <= record.returncode != 127
        if key and finished and record is not None:  # timed-out and unstartable runs are not kept
            cache.store(key, record, plans[p].inputs)
    return out, prepared


def _planned(command: Command, cwd: Path) -> dict[str, Any]:
    """A compiler run as a build launch takes it (harness/contracts.py BuildCommand)."""
    planned: dict[str, Any] = {"argv": command.argv, "cwd": str(cwd)}
    if command.header is not None:
        planned["header"] = command.header
    return planned


def _parse_record(value: Any) -> CommandRecord | None:
    """A compiler run as the build launch reported it (untrusted: checked, output capped)."""
    try:
        record = CommandRecord.model_validate(value)
    except ValidationError:
        return None
    return record.model_copy(update={"output": record.output[:_MAX_CAPTURED_OUTPUT]})


def unit_result(
    plan: UnitPlan, ran: Sequence[tuple[CommandRecord | None, bool]], timeout_s: float
) -> CompileUnit:
    """A unit's diagnostics and kernel resources from the output of each of its compiler runs."""
    work = plan.work
    lost = CommandRecord(returncode=None, output="", elapsed_s=0.0)
    records = [record if record is not None else lost for record, _ in ran]
    hits = [hit for _, hit in ran]
    diagnostics = list(plan.diagnostics)
    kernels: list[KernelResources] = []
    logs: list[str] = []
    for command, record in zip(plan.commands, records, strict=True):
        logs.append(f"$ {_shown(command.argv, work)}{_header_said(record.header)}\n{record.output}")
        output = record.output.replace("<build>", str(work))
        found = [
            _place(d, command, work)
            for d in parse_diagnostics(output, tool=command.tool)
            if d.code != PCH_REFUSED  # pkb's own header, not the candidate's: its refusal is no finding
        ]
        if record.returncode is None:
            found.append(tool_message(f"build timed out after {timeout_s:g} s ({command.tool} was killed)"))
        elif record.returncode < 0 or record.returncode == 127:
            found.append(tool_message(f"{command.tool} failed to run (status {record.returncode}); see log"))
        elif record.returncode != 0 and not any(d.severity == "error" for d in found):
            found.append(
                tool_message(
                    f"{command.tool} exited with status {record.returncode}; see log", tool=command.tool
                )
            )
        diagnostics += found
        if command.tool == "nvcc":
            kernels += parse_ptxas_resources(output)
    names = demangle([k.mangled for k in kernels])
    kernels = [k.model_copy(update={"kernel": names.get(k.mangled, k.mangled)}) for k in kernels]
    diagnostics = _dedupe(diagnostics)
    diagnostics.sort(key=lambda d: d.severity != "error")  # stable: errors first, compiler order kept
    if len(diagnostics) > _MAX_DIAGNOSTICS_PER_UNIT:
        omitted = len(diagnostics) - _MAX_DIAGNOSTICS_PER_UNIT
        diagnostics = diagnostics[:_MAX_DIAGNOSTICS_PER_UNIT]
        diagnostics.append(
            tool_message(f"{omitted} more diagnostics omitted; see the log", severity="warning")
        )
    return CompileUnit(
        name=plan.name,
        ok=not any(d.severity == "error" for d in diagnostics),
        diagnostics=diagnostics,
        kernels=kernels,
        build_time_s=_build_time(records, hits),
        cache_hit=bool(plan.commands) and all(hits),
        command="\n".join(_shown(command.argv, work) for command in plan.commands),
        log="\n".join(logs)[:_LOG_LIMIT],
    )


def _header_said(header: bool | None) -> str:
    """What a compiler run's log line says of torch's precompiled header (CommandRecord.header)."""
    if header is None:
        return ""
    return " (with torch's precompiled header)" if header else " (GCC refused torch's precompiled header)"


def _build_time(records: Sequence[CommandRecord], hits: Sequence[bool]) -> float:
    """A unit's build time: its commands run side by side, so its slowest command's, of those run now
    (after an edit of one source, what the edit cost, not the cached commands' original times); the
    original build's where every command came from the cache."""
    ran_now = [r.elapsed_s for r, hit in zip(records, hits, strict=True) if not hit]
    return max(ran_now or [r.elapsed_s for r in records], default=0.0)


def _dedupe(diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
    return list({(d.file, d.line, d.column, d.severity, d.message): d for d in diagnostics}.values())


def _place(diagnostic: Diagnostic, command: Command, work: Path) -> Diagnostic:
    """Rewrite a compiler's file name to what the user knows: the .py line, or the file's given name."""
    if diagnostic.file is None:
        return diagnostic
    path = os.path.normpath(os.path.join(work, diagnostic.file))
    if command.line_map is not None and path == command.line_map.generated and diagnostic.line is not None:
        file, line = command.line_map.map(diagnostic.line)
        column = diagnostic.column if file != command.line_map.py_display else None
        return diagnostic.model_copy(update={"file": file, "line": line, "column": column})
    if path in command.paths:
        return diagnostic.model_copy(update={"file": command.paths[path]})
    return diagnostic.model_copy(update={"file": diagnostic.file.replace(str(work), "<build>")})


def _shown(argv: Sequence[str], work: Path) -> str:
    return shlex.join(argv).replace(str(work), "<build>")
