"""What a build reports: diagnostics, per-kernel resources, units and the whole result (pydantic models).

Offers `CompileResult` (with its text summary), `CompileUnit`, `Diagnostic`, `KernelResources`, `Severity`,
`CompileError` (bad input or a missing toolchain) and `tool_message` (a diagnostic about the build itself).
Imports only pkb_mcp.models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from pkb_mcp.models import Result

Severity = Literal["error", "warning"]


class CompileError(ValueError):
    """Bad input or a missing toolchain: one sentence that says what to fix."""


class Diagnostic(Result):
    """One compiler (or import) message."""

    file: str | None = Field(description="null: about the build")
    line: int | None = None
    column: int | None = None
    severity: Severity
    message: str
    code: str | None = None
    tool: str = Field(description="nvcc, ptxas, c++, python or pkb")

    def location(self) -> str:
        if self.file is None:
            return self.tool
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def one_line(self) -> str:
        code = f" [{self.code}]" if self.code else ""
        first = (self.message.splitlines() or [""])[0]
        return f"{self.location()}: {self.severity}{code}: {first}"


def tool_message(message: str, *, severity: Severity = "error", tool: str = "pkb") -> Diagnostic:
    """A message about the build itself rather than a line of source."""
    return Diagnostic(file=None, severity=severity, message=message, tool=tool)


class KernelResources(Result):
    """One kernel's resources per `ptxas -v` (bytes per thread unless said)."""

    kernel: str = Field(description="demangled name")
    mangled: str
    arch: str
    registers: int = Field(description="registers per thread")
    shared_bytes: int = Field(description="static, per block")
    constant_bytes: int | None = None
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int
    cumulative_stack_bytes: int | None = None


class CompileUnit(Result):
    # One build: a .cu file, or one extension of a solution (its CUDA and C++ sources).

    name: str
    ok: bool
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    kernels: list[KernelResources] = Field(default_factory=list)
    build_time_s: float = Field(
        description="its slowest compiler run of this build (the original build's where all were cached)"
    )
    cache_hit: bool = False
    command: str
    log: str = ""


class CompileResult(Result):
    """What `compile_kernel` returns."""

    ok: bool
    kind: Literal["cuda", "solution"]
    source: str
    arch: str
    units: list[CompileUnit] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(default_factory=list, description="file-level, e.g. a SyntaxError")
    build_time_s: float
    cache_hit: bool
    notes: list[str] = Field(default_factory=list)
    sandbox: str = Field("", description="docker (isolated) or process (not)")

    def all_diagnostics(self) -> list[Diagnostic]:
        return [*self.diagnostics, *(d for unit in self.units for d in unit.diagnostics)]

    def errors(self) -> list[Diagnostic]:
        return [d for d in self.all_diagnostics() if d.severity == "error"]

    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.all_diagnostics() if d.severity == "warning"]

    def summary(self, max_messages: int = 15) -> str:
        """Compact text: verdict, errors with file:line, warnings, kernel resource table, notes."""
        errors, warnings = self.errors(), self.warnings()
        verdict = "ok" if self.ok else "FAILED"
        hit = ", cache hit" if self.cache_hit else ""
        lines = [
            f"{self.source} [{self.kind}, {self.arch}]: {verdict}: {_count(len(errors), 'error')}, "
            f"{_count(len(warnings), 'warning')}; {len(self.units)} unit(s); {self.build_time_s:.1f} s{hit}"
        ]
        for title, group in (("errors", errors), ("warnings", warnings)):
            if not group:
                continue
            lines.append(f"{title}:")
            for d in group[:max_messages]:
                lines.append(f"  {d.one_line()}")
                if d.severity == "error":  # context such as a trimmed traceback or a template instantiation
                    lines.extend(f"      {extra}" for extra in d.message.splitlines()[1:4])
            if len(group) > max_messages:
                lines.append(f"  ... and {len(group) - max_messages} more")
        kernels = [(unit.name, k) for unit in self.units for k in unit.kernels]
        if kernels:
            lines.append("kernels (ptxas; bytes per thread for stack/spills, per block for smem):")
            lines.extend(f"  {row}" for row in _kernel_table(kernels))
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  - {note}" for note in self.notes)
        return "\n".join(lines)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _kernel_table(kernels: Sequence[tuple[str, KernelResources]]) -> list[str]:
    header = ("unit", "kernel", "regs", "smem", "cmem", "stack", "spill st", "spill ld", "barriers")
    rows = [header]
    for unit, k in kernels:
        name = k.kernel if len(k.kernel) <= 60 else k.kernel[:57] + "..."
        cmem = "-" if k.constant_bytes is None else str(k.constant_bytes)
        rows.append(
            (
                unit,
                name,
                str(k.registers),
                str(k.shared_bytes),
                cmem,
                str(k.stack_frame_bytes),
                str(k.spill_store_bytes),
                str(k.spill_load_bytes),
                str(k.barriers),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return out
