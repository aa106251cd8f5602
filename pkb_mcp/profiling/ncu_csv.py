"""What Nsight Compute printed in a counter launch (`ncu --csv --page raw --log-file`), read without
trusting it (docs/nvlink-counters.md, "Trust").

The file holds the tool's own lines (`==PROF==`, `==WARNING==`, `==ERROR==`) and its CSV. Two CSV
shapes are understood, by their header: the raw page (one row per kernel, one column per metric,
a second row of units) and the details page (one row per kernel and metric, with "Metric Name",
"Metric Unit" and "Metric Value"). Both are Nsight Compute's documented outputs; neither has been
seen from our machines yet, so the reader asks only for the columns it needs ("ID", "Kernel Name",
the metrics) and ignores the rest.

Caps: the file's bytes, rows, columns and a line's length; names cut to traces.NAME_CHARS; numbers
finite and non-negative, thousands separators removed, converted to base units (bytes, nanoseconds,
counts); a value in a unit not known here is left out. Standard library only.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pkb_mcp.profiling.traces import NAME_CHARS, TraceError, read_capped

NCU_CSV_CAP = 4 << 20  # bytes of one rank's ncu log
MAX_ROWS = 20_000
MAX_COLUMNS = 512
MAX_LINE = 64 << 10
MAX_TOOL_LINES = 20  # ==ERROR== / ==WARNING== lines kept
PASSES = re.compile(r"-\s*(\d{1,4})\s+pass(?:es)?\s*$")
# units as ncu prints them, to base units (bytes, nanoseconds, plain counts); --print-units base
# should leave only the first of each row, the others are there for a tool that ignored it
UNIT_SCALE = {
    "byte": 1.0, "bytes": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 1024.0**2, "gib": 1024.0**3,
    "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6,
    "sector": 1.0, "sectors": 1.0, "": 1.0, "%": 1.0, "cycle": 1.0, "inst": 1.0, "warp": 1.0,
}  # fmt: skip


class NcuError(TraceError):
    """An ncu log that cannot be used; the message says why (with ncu's own error where it wrote one)."""


@dataclass(frozen=True)
class KernelRow:
    """One profiled kernel of one rank, in the order ncu profiled them."""

    index: int
    name: str
    metrics: dict[str, float]  # base units


@dataclass
class NcuRead:
    kernels: list[KernelRow] = field(default_factory=list)
    passes: int | None = None  # the most replay passes ncu reported for a kernel
    messages: list[str] = field(default_factory=list)  # ncu's ==ERROR== and ==WARNING== lines


def number(text: str, unit: str) -> float | None:
    """A value in base units, or None (not a number, negative, infinite, or an unknown unit)."""
    scale = UNIT_SCALE.get(unit.strip().lower())
    cleaned = text.strip().replace(",", "")
    if scale is None or not cleaned or len(cleaned) > 40:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value * scale


def _split(text: str) -> tuple[list[str], list[str], int | None]:
    """(the CSV lines, ncu's error and warning lines, the most passes it reported)."""
    rows: list[str] = []
    messages: list[str] = []
    passes: int | None = None
    for line in text.splitlines():
        if len(line) > MAX_LINE:
            raise NcuError(f"the ncu log has a line of {len(line)} characters, over {MAX_LINE}")
        if line.startswith("=="):
            found = PASSES.search(line)
            if found:
                passes = max(passes or 0, int(found.group(1)))
            if line.startswith(("==ERROR==", "==WARNING==")) and len(messages) < MAX_TOOL_LINES:
                messages.append(line[:300])
            continue
        if line.strip():
            rows.append(line)
        if len(rows) > MAX_ROWS:
            raise NcuError(f"the ncu log has more than {MAX_ROWS} rows")
    return rows, messages, passes


def _table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """The header (the first row naming "ID" and "Kernel Name") and the rows after it."""
    rows = list(csv.reader(lines))
    for i, row in enumerate(rows):
        if len(row) > MAX_COLUMNS:
            raise NcuError(f"the ncu CSV has a row of {len(row)} columns, over {MAX_COLUMNS}")
        if "ID" in row and "Kernel Name" in row:
            return row, rows[i + 1 :]
    raise NcuError("the ncu log holds no CSV of profiled kernels")


def _index(cell: str) -> int | None:
    cell = cell.strip()
    return int(cell) if cell.isdigit() and len(cell) < 10 else None


def _kernel_rows(header: list[str], rows: list[list[str]]) -> Iterator[tuple[int, list[str]]]:
    """(kernel index, row) of the rows that are whole and carry a kernel's ID."""
    id_col = header.index("ID")
    for row in rows:
        if len(row) == len(header) and (index := _index(row[id_col])) is not None:
            yield index, row


def _raw(header: list[str], rows: list[list[str]], wanted: set[str]) -> list[KernelRow]:
    col = {name: i for i, name in enumerate(header)}
    # the units row: the first row after the header, with no ID
    first = rows[0] if rows else []
    units = first if len(first) == len(header) and not first[col["ID"]].strip() else []
    metric_cols = {m: col[m] for m in wanted if m in col}
    out = []
    for index, row in _kernel_rows(header, rows):
        values = {}
        for m, i in metric_cols.items():
            v = number(row[i], units[i] if units else "")
            if v is not None:
                values[m] = v
        out.append(KernelRow(index, row[col["Kernel Name"]][:NAME_CHARS], values))
    return out


def _details(header: list[str], rows: list[list[str]], wanted: set[str]) -> list[KernelRow]:
    col = {name: i for i, name in enumerate(header)}
    unit_col = col.get("Metric Unit")
    kernels: dict[int, tuple[str, dict[str, float]]] = {}
    for index, row in _kernel_rows(header, rows):
        _, values = kernels.setdefault(index, (row[col["Kernel Name"]][:NAME_CHARS], {}))
        metric = row[col["Metric Name"]]
        if metric in wanted:
            v = number(row[col["Metric Value"]], row[unit_col] if unit_col is not None else "")
            if v is not None:
                values[metric] = v
    return [KernelRow(i, name, values) for i, (name, values) in sorted(kernels.items())]


def parse(text: str, metrics: list[str]) -> NcuRead:
    """The kernels and their `metrics` in an ncu log's text (untrusted); NcuError when there are none,
    carrying ncu's first error line if it wrote one."""
    lines, messages, passes = _split(text)
    try:
        header, rows = _table(lines)
    except NcuError as exc:
        errors = [m for m in messages if m.startswith("==ERROR==")]
        raise NcuError(f"{exc}; ncu said: {errors[0]}" if errors else str(exc)) from None
    wanted = set(metrics)
    if "Metric Name" in header and "Metric Value" in header:
        kernels = _details(header, rows, wanted)
    else:
        kernels = _raw(header, rows, wanted)
    if not kernels:
        raise NcuError("the ncu CSV lists no kernel")
    kernels.sort(key=lambda k: k.index)
    return NcuRead(kernels=kernels, passes=passes, messages=messages)


def read(path: Path, metrics: list[str], cap: int = NCU_CSV_CAP, root: Path | None = None) -> NcuRead:
    """One rank's ncu log file: size-capped, decoded leniently, parsed by `parse`; `root`: the launch
    directory it lies in (traces.read_capped)."""
    return parse(read_capped(path, cap, root).decode("utf-8", "replace"), metrics)
