"""A profile's text: what `pkb profile` prints and the profile tool's `content` (the figures:
docs/measurement.md, "Profile")."""

from __future__ import annotations

from pkb_mcp.profiling.profile import ProfileResult
from pkb_mcp.render import rank_table, static_lines, table, warning_lines


def nvlink_lines(r: ProfileResult) -> list[str]:
    """The NVLink bytes of each side: per rank and call, and the kernels that moved them
    (docs/nvlink-counters.md)."""
    lines = []
    for label, side in (("candidate", r.candidate), ("reference", r.reference)):
        n = side.nvlink if side is not None else None
        if n is None or not n.ranks:
            continue
        per_rank = ", ".join(
            f"rank {k.rank} {k.tx_bytes / 2**20:.3g} out / {k.rx_bytes / 2**20:.3g} in" for k in n.ranks
        )
        floor = f"; floor {n.floor_bytes / 2**20:.3g} MiB each way" if n.floor_bytes else ""
        lines.append(f"NVLink {label} ({n.method}), MiB per call: {per_rank}{floor}")
        for k in n.kernels:
            speed = f", {k.gbps:.4g} GB/s ({k.pct_of_ceiling:.0f}%)" if k.gbps is not None else ""
            lines.append(
                f"  rank {k.rank} {k.name[:70]} [{k.category}, {k.mechanism}]: "
                f"{k.tx_bytes / 2**20:.3g} out / {k.rx_bytes / 2**20:.3g} in MiB{speed}"
            )
    return lines


def profile(r: ProfileResult, trace: str | None = None, timeline: str | None = None) -> str:
    """The profile side by side (figures: docs/measurement.md, "Profile"); `trace` and `timeline`
    name the artifacts (resource URIs for MCP clients), else their paths."""
    lines = [
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size}, device {r.device}, "
        f"{r.wall_s:.1f} s, sandbox {r.sandbox.backend}"
    ]
    rows = []
    for label, side in (("candidate", r.candidate), ("reference", r.reference)):
        for k in side.ranks if side is not None else []:
            wait = "" if k.wait_ms is None else f"{k.wait_ms:.4g}"
            figures = [k.call_ms, k.comm_ms, k.compute_ms, k.overlap_ms, k.gap_ms]
            rows.append(
                [
                    label,
                    str(k.rank),
                    *(f"{x:.4g}" for x in figures),
                    wait,
                    f"{k.launches:g}",
                    f"{k.enqueue_ms:.4g}",
                ]
            )
    if rows:
        header = ["", "rank", "call ms", "comm", "compute", "overlap", "gap", "wait", "launches", "enqueue"]
        lines.append(table(rows, header))
    for label, side in (("candidate", r.candidate), ("reference", r.reference)):
        if side is not None and side.top:
            top = "; ".join(f"{k.name} [{k.category}] {k.ms:.4g} ms x{k.count:g}" for k in side.top)
            lines.append(f"top {label}: {top}")
    lines += nvlink_lines(r)
    if r.verdict != "ok":
        lines.append(rank_table(r.ranks))
    lines += [f"- {f}" for f in r.findings]
    lines.append(f"{r.verdict.upper()}: {r.message}")
    if r.counters:
        lines.append(r.counters)
    if r.trace is not None:
        cut = f", {r.trace.cut_events} cut" if r.trace.cut_events else ""
        lines.append(
            f"trace (Perfetto / chrome://tracing): {trace or r.trace.path} ({r.trace.events} events{cut})"
        )
    if r.timeline is not None:
        lines.append(f"timeline: {timeline or r.timeline.path}")
    lines += static_lines(r.static_report)
    return "\n".join(lines + warning_lines(r.warnings))
