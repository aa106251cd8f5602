"""Text renderings of service results: the CLI's tables and the MCP tools' `content` text.

One rendering per result type, so what a person reads in a terminal and what an agent reads through
a client that shows only `content` are the same facts.
"""

from __future__ import annotations

from pkb_mcp.errors import UserError
from pkb_mcp.models import (
    BenchResult,
    Calibration,
    CheckResult,
    Floor,
    ProblemDetail,
    ProblemPage,
    ProblemSummary,
    RankResult,
    RooflineResult,
    StaticReport,
)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def counted(n: float, noun: str) -> str:
    """`n noun`, the noun plural unless n is 1 ("1 round", "2 rounds", "0 files")."""
    return f"{n:g} {noun}" if n == 1 else f"{n:g} {noun}s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g}"


def rank_table(results: list[RankResult], headline: str = "") -> str:
    """The ranks' table, then what each failed rank said (once for ranks that said the same; not at all
    where it is the `headline`, printed under the table)."""
    rows = []
    for r in results:
        err = "" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
        rel = "" if r.rel_norm_error is None else f"{r.rel_norm_error:.3g}"
        where = "" if r.first_mismatch is None else f"out {r.first_mismatch.output} {r.first_mismatch.index}"
        rows.append([str(r.rank), r.state, "" if r.trial is None else str(r.trial), err, rel, where])
    text = table(rows, ["rank", "state", "trial", "max abs err", "rel norm", "first mismatch"])
    told: dict[tuple[str, str], int] = {}  # what a rank failed with, and the first rank told it
    for r in results:
        said = (r.message or "", r.traceback or r.log_tail or "")
        if said == (headline, ""):
            continue  # it says only what the headline says
        if r.state != "pass" and said in told:
            text += f"\nrank {r.rank}: as rank {told[said]}"
            continue
        if r.state != "pass":
            told.setdefault(said, r.rank)
        if r.state != "pass" and r.message and r.message != headline:
            text += f"\nrank {r.rank}: {r.message}"
        if r.traceback:
            text += "\n" + "\n".join("    " + line for line in r.traceback.rstrip().splitlines()[-12:])
        elif r.log_tail and r.log_tail.strip():  # what the rank printed, whatever its state
            text += f"\nrank {r.rank} printed (last lines):\n" + "\n".join(
                "    " + line for line in r.log_tail.rstrip().splitlines()[-8:]
            )
    return text


def check(r: CheckResult) -> str:
    head = (
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size}, device {r.device}, "
        f"{r.trials} trials, {r.wall_s:.1f} s, sandbox {r.sandbox.backend}"
    )
    return "\n".join(
        [
            head,
            rank_table(r.ranks, r.message),
            f"{r.verdict.upper()}: {r.message}",
            *unseen_lines(r),
            *static_lines(r.static_report),
            *warning_lines(r.warnings),
            *note_lines(r.notes),
        ]
    )


def unseen_lines(r: CheckResult) -> list[str]:
    """Whether a passing candidate generalizes, and where it was judged (the failing rank's outcome
    where it does not)."""
    return [] if r.unseen is None else [f"generalizes: {r.generalizes}: {r.unseen.message}"]


def warning_lines(items: list[str]) -> list[str]:
    return [f"warning: {w}" for w in items]


def note_lines(items: list[str]) -> list[str]:
    return [f"note: {n}" for n in items]


def _some(items: list[str], n: int) -> str:
    shown = ", ".join(items[:n])
    return shown + (f" (+{len(items) - n} more)" if len(items) > n else "") if items else "none"


def static_lines(s: StaticReport | None) -> list[str]:
    """One line of what the source still calls; a second for patterns worth a look, if any."""
    if s is None:
        return []
    lines = [
        f"static: collectives {_some(s.collectives, 6)}; compute {_some(s.compute_ops, 6)}; "
        f"multicast {'USED (refused)' if s.multicast else 'no'}"
    ]
    if s.suspicious:
        lines.append(f"static: suspicious: {_some(s.suspicious, 3)}")
    return lines


def _percent(share: float) -> str:
    """A share of the floor as a percentage to two significant figures; a share that is not 0 but
    rounds to it is said to be under 0.01% (28 bytes in a 2 ms floor are not nothing, nor a figure)."""
    if 0 < share < 1e-4:
        return "<0.01%"
    return f"{100 * share:.2g}%"


def binding_line(f: Floor) -> str:
    """What binds the floor and the exchange's part of it, one line (`pkb show` and `pkb roofline`)."""
    return (
        f"binds: {f.bound}; the exchange: NVLink {_percent(f.nvlink_share)} + latency "
        f"{_percent(f.latency_share)} of the floor"
    )


def roofline(r: RooflineResult) -> str:
    t = r.traffic
    c = r.ceilings
    rows = [
        ["NVLink", fmt_bytes(t.nvlink_bytes), f"{c.nvlink_gbps:g} GB/s", f"{r.nvlink_ms * 1e3:.2f}"],
        ["HBM", fmt_bytes(t.hbm_bytes), f"{c.hbm_gbps:g} GB/s", f"{r.hbm_ms * 1e3:.2f}"],
        ["compute", f"{t.flops:.4g} FLOP", "peak", f"{r.compute_ms * 1e3:.2f}"],
        [
            "latency",
            counted(t.rounds, "round"),
            f"{c.round_latency_us:g} us/round",
            f"{r.latency_ms * 1e3:.2f}",
        ],
    ]
    lines = [
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size} (per GPU)",
        table(rows, ["term", "traffic", "ceiling", "time (us)"]),
        f"floor {r.floor_ms * 1e3:.2f} us ({r.bound}-bound); ceilings: {c.source}",
        binding_line(r),
    ]
    if r.pct_of_floor is not None and r.time_ms is not None:
        lines.append(f"measured {r.time_ms * 1e3:.2f} us = {r.pct_of_floor:.1f}% of the floor")
    if r.note:
        lines.append(f"note: {r.note}")
    return "\n".join(lines)


def speedup_words(speedup: float, low: float | None, high: float | None, within_noise: bool | None) -> str:
    """A benchmark's speedup as every headline says it (the result's message, so the CLI, an MCP
    tool's text and a task's status; the job's last message): a figure within noise says so first,
    the figure after it as measured, not credited (docs/measurement.md, "within_noise")."""
    spread = f"quartile range {low:.3f}-{high:.3f}" if low is not None and high is not None else ""
    if within_noise:
        measured = ", ".join([f"{speedup:.3f}x measured", *([spread] if spread else []), "not credited"])
        return f"within noise of the reference ({measured})"
    return f"{speedup:.3f}x the reference" + (f" ({spread})" if spread else "")


def bench_headline(r: BenchResult) -> str:
    """A benchmark's verdict and what leads its message, in one line: the job's last message."""
    if r.verdict == "pass" and r.speedup is not None:
        return f"PASS: {speedup_words(r.speedup, r.speedup_low, r.speedup_high, r.within_noise)}"
    return f"{r.verdict.upper()}: {r.message}"


def bench(r: BenchResult) -> str:
    lines = [
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size}, device {r.device}, "
        f"{r.wall_s:.1f} s, sandbox {r.sandbox.backend}"
    ]
    rows = []
    for label, s in (("reference", r.reference), ("candidate", r.candidate)):
        if s is not None:
            rows.append(
                [
                    label,
                    f"{s.median_ms:.4g}",
                    f"{s.iqr_ms:.3g}",
                    f"{s.min_ms:.4g}",
                    str(s.samples),
                    str(s.input_sets),
                    s.stop_reason,
                ]
            )
    if rows:
        lines.append(
            table(rows, ["", "median ms", "IQR ms", "min ms", "samples", "input sets", "stopped on"])
        )
    if r.verdict in ("fail", "timeout"):
        lines.append(rank_table(r.ranks, r.message))
    if r.speedup is not None:
        lines.append("speedup: " + speedup_words(r.speedup, r.speedup_low, r.speedup_high, r.within_noise))
    fresh = [
        f"{label} {s.fresh_calls} calls, median {s.fresh_median_ms:.4g} ms, replay advantage "
        f"{s.replay_advantage:.2f}"
        for label, s in (("reference", r.reference), ("candidate", r.candidate))
        if s is not None and s.fresh_median_ms is not None and s.replay_advantage is not None
    ]
    if fresh:
        on_fresh = f"; speedup on them {r.fresh_speedup:.3f}x" if r.fresh_speedup is not None else ""
        lines.append("fresh inputs: " + "; ".join(fresh) + on_fresh)
    if r.roofline is not None:
        roof = r.roofline
        pct = f", {roof.pct_of_floor:.1f}% of floor" if roof.pct_of_floor is not None else ""
        lines.append(
            f"floor {roof.floor_ms * 1e3:.2f} us ({roof.bound}-bound){pct}"
            + (f"; {roof.note}" if roof.note else "")
        )
    lines.append(f"{r.verdict.upper()}: {r.message}")
    lines += static_lines(r.static_report)
    return "\n".join(lines + warning_lines(r.warnings) + note_lines(r.notes))


def other_ranks(d: ProblemDetail) -> list[str]:
    """The other ranks' inputs where they differ from rank 0's (the table's): one line per argument,
    so a problem whose ranks hold uneven shards or splits shows them. The suite is imported here, not
    at the top: `pkb --help` and `pkb problems` import this module and no torch."""
    from pkb_mcp import problems as suite

    try:
        p = suite.resolve(d.id, d.variant)
    except UserError:
        return []
    ranks = [p.input_shapes(d.world_size, d.size_preset, rank) for rank in range(d.world_size)]
    lines = []
    for i, first in enumerate(ranks[0]):
        if all(specs[i] == first for specs in ranks[1:]):
            continue
        said = [
            f"rank {r} {specs[i]['shape'] if 'shape' in specs[i] else specs[i].get('value')}"
            for r, specs in enumerate(ranks)
            if r > 0
        ]
        lines.append(f"  {first['name']}: " + ", ".join(said))
    return ["other ranks, where theirs differ:", *lines] if lines else []


def show(d: ProblemDetail) -> str:
    inputs = [
        [i.name, str(i.shape) if i.shape is not None else "", i.dtype or "", i.value or ""] for i in d.inputs
    ]
    t = d.traffic
    return "\n".join(
        [
            f"problem {d.id} {d.name} [{d.category}] from {d.source}"
            + ("" if d.variant == "pkb" else f", {d.variant} variant (docs/variants.md)"),
            "",
            d.description,
            "",
            f"contract: {d.signature}",
            f"world sizes: {d.world_sizes}; dtype {d.dtype}; tolerance of each output "
            + str({k: v for k, v in d.tolerance.items() if k != "outputs"})
            + "".join(f"; output {i}: {b}" for i, b in (d.tolerance.get("outputs") or {}).items()),
            "sizes: " + "; ".join(f"{k} {v}" for k, v in d.sizes.items()),
            f"inputs of rank 0 at world size {d.world_size}, size {d.size_preset}:",
            table(inputs, ["arg", "shape", "dtype", "value"]),
            *other_ranks(d),
            f"traffic per GPU: NVLink {fmt_bytes(t.nvlink_bytes)} each way, HBM {fmt_bytes(t.hbm_bytes)}, "
            f"{t.flops:.4g} FLOP, {counted(t.rounds, 'round')}",
            f"floor {d.floor.floor_ms * 1e3:.2f} us; " + binding_line(d.floor),
            *(
                [f"  why the exchange stays minor at any size: {d.minor_exchange}"]
                if d.minor_exchange
                else []
            ),
            *original_lines(d),
        ]
    )


def original_lines(d: ProblemDetail) -> list[str]:
    """The original benchmark's signature, the call made from our inputs, and the stated differences."""
    o = d.original
    if o is None:
        return []
    how = (
        f"is called (on rank 0) as {o.call}"
        if o.callable
        else "cannot run on this workload: write it to the contract above"
    )
    lines = ["", f"original benchmark's signature: {o.signature}", f"  an original-format file {how}"]
    if o.differences:
        lines.append(f"  differences from the original: {o.differences}")
    return lines


def problems(found: list[ProblemSummary]) -> str:
    rows = [[str(p.id), p.name, p.category, p.world_sizes, p.summary] for p in found]
    return table(rows, ["id", "name", "category", "world sizes", "summary"])


def problem_page(page: ProblemPage) -> str:
    """A page of list_problems: its rows, and where the next page starts when there is one."""
    if not page.problems:
        return f"none from offset {page.offset}: {page.total} match" if page.total else "no problem matches"
    detail = page.problems[0].world_sizes is not None
    header = ["id", "name", "category", *(["source", "dtype", "world sizes"] if detail else []), "summary"]
    rows = []
    for p in page.problems:
        more = [p.source or "", p.dtype or "", p.world_sizes or ""] if detail else []
        rows.append([str(p.id), p.name, p.category, *more, p.summary])
    lines = [table(rows, header)]
    if page.next_offset is not None or page.offset:
        shown = f"problems {page.offset + 1}-{page.offset + len(rows)} of {page.total}"
        nxt = page.next_offset
        lines.append(shown + (f"; the next page starts at offset {nxt}" if nxt is not None else ""))
    return "\n".join(lines)


def calibration(c: Calibration) -> str:
    """The node's measured ceilings, one line each, and where they were saved."""
    d = c.details
    lines = [
        f"peer copy, one direction: {c.ceilings.nvlink_gbps:.1f} GB/s "
        f"(median of {len(d['peer_copy'])} GPU pairs)",
        f"HBM copy (read + write): {c.ceilings.hbm_gbps:.1f} GB/s",
        "matmul: " + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in d["matmul_tflops"].items()),
    ]
    lib = "NCCL" if d.get("device") == "cuda" else "gloo"
    for name, m in d["collectives"].items():
        if isinstance(m, dict):
            lines.append(
                f"{lib} {name}, {m['bytes'] / 2**20:.0f} MiB: bus bandwidth {m['busbw_gbps']:.1f} GB/s"
            )
    lines.append(f"8-byte all_reduce: {d['collectives']['small_all_reduce_us']:.1f} us")
    lines.append(f"source: {c.ceilings.source}")
    lines.append(f"saved to {c.saved_to}" if c.saved_to else "dry run on CPU: nothing saved")
    return "\n".join(lines)
