"""`pkb`: the command line over the service layer.

Readable tables by default, `--json` for scripts. Exit codes: 0 pass, 1 the candidate failed
(wrong, crashed, timed out, does not build), 2 bad input or environment. A user error is one
sentence on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pkb_mcp import log, service
from pkb_mcp.errors import UserError
from pkb_mcp.models import BenchResult, CheckResult, ProblemDetail, RankResult, RooflineResult
from pkb_mcp.problems import ProblemFormatError

EXIT_PASS, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"pkb: {message}; see pkb --help\n")


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g}"


def _progress(quiet: bool) -> service.Progress:
    def report(done: float, total: float | None, message: str) -> None:
        if not quiet:
            print(f"  [{done:g}/{total:g}] {message}" if total else f"  {message}", file=sys.stderr)

    return report


# ---------------------------------------------------------------- renderers


def _render_ranks(ranks: list[RankResult]) -> str:
    rows = []
    for r in ranks:
        err = "" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
        rel = "" if r.rel_norm_error is None else f"{r.rel_norm_error:.3g}"
        where = "" if r.first_mismatch is None else f"out {r.first_mismatch.output} {r.first_mismatch.index}"
        rows.append([str(r.rank), r.state, "" if r.trial is None else str(r.trial), err, rel, where])
    text = _table(rows, ["rank", "state", "trial", "max abs err", "rel norm", "first mismatch"])
    for r in ranks:
        if r.state != "pass" and r.message:
            text += f"\nrank {r.rank}: {r.message}"
        if r.traceback:
            text += "\n" + "\n".join("    " + line for line in r.traceback.rstrip().splitlines()[-12:])
        elif r.state in ("crashed", "timeout", "exited") and r.log_tail:
            text += "\n  last log lines:\n" + "\n".join(
                "    " + line for line in r.log_tail.rstrip().splitlines()[-8:]
            )
    return text


def _render_check(r: CheckResult) -> str:
    head = (
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size}, device {r.device}, "
        f"{r.trials} trials, {r.wall_s:.1f} s, sandbox {r.sandbox.backend}"
    )
    return "\n".join([head, _render_ranks(r.ranks), f"{r.verdict.upper()}: {r.message}", *_warn(r.warnings)])


def _warn(warnings: list[str]) -> list[str]:
    return [f"warning: {w}" for w in warnings]


def _render_roofline(r: RooflineResult) -> str:
    t = r.traffic
    c = r.ceilings
    rows = [
        ["NVLink", _fmt_bytes(t.nvlink_bytes), f"{c.nvlink_gbps:g} GB/s", f"{r.nvlink_ms * 1e3:.2f}"],
        ["HBM", _fmt_bytes(t.hbm_bytes), f"{c.hbm_gbps:g} GB/s", f"{r.hbm_ms * 1e3:.2f}"],
        ["compute", f"{t.flops:.4g} FLOP", "peak", f"{r.compute_ms * 1e3:.2f}"],
        ["latency", f"{t.rounds:g} rounds", f"{c.round_latency_us:g} us/round", f"{r.latency_ms * 1e3:.2f}"],
    ]
    lines = [
        f"problem {r.problem_id} {r.problem}: world size {r.world_size}, size {r.size} (per GPU)",
        _table(rows, ["term", "traffic", "ceiling", "time (us)"]),
        f"floor {r.floor_ms * 1e3:.2f} us ({r.bound}-bound); ceilings: {c.source}",
    ]
    if r.pct_of_floor is not None and r.time_ms is not None:
        lines.append(f"measured {r.time_ms * 1e3:.2f} us = {r.pct_of_floor:.1f}% of the floor")
    if r.note:
        lines.append(f"note: {r.note}")
    return "\n".join(lines)


def _render_bench(r: BenchResult) -> str:
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
            _table(rows, ["", "median ms", "IQR ms", "min ms", "samples", "input sets", "stopped on"])
        )
    if r.verdict != "pass":
        lines.append(_render_ranks(r.ranks))
    if r.speedup is not None:
        lines.append(f"speedup {r.speedup:.3f}x (quartile range {r.speedup_low:.3f}-{r.speedup_high:.3f})")
    if r.roofline is not None:
        roof = r.roofline
        pct = f", {roof.pct_of_floor:.1f}% of floor" if roof.pct_of_floor is not None else ""
        lines.append(
            f"floor {roof.floor_ms * 1e3:.2f} us ({roof.bound}-bound){pct}"
            + (f"; {roof.note}" if roof.note else "")
        )
    lines.append(f"{r.verdict.upper()}: {r.message}")
    return "\n".join(lines + _warn(r.warnings))


def _render_show(d: ProblemDetail) -> str:
    inputs = [
        [i.name, str(i.shape) if i.shape is not None else "", i.dtype or "", i.value or ""] for i in d.inputs
    ]
    t = d.traffic
    return "\n".join(
        [
            f"problem {d.id} {d.name} [{d.category}] from {d.source}",
            "",
            d.description,
            "",
            f"contract: {d.signature}",
            f"world sizes: {d.world_sizes}; dtype {d.dtype}; tolerance {d.tolerance}",
            "sizes: " + "; ".join(f"{k} {v}" for k, v in d.sizes.items()),
            f"inputs per rank at world size {d.world_size}, size {d.size_preset}:",
            _table(inputs, ["arg", "shape", "dtype", "value"]),
            f"traffic per GPU: NVLink {_fmt_bytes(t.nvlink_bytes)} each way, HBM {_fmt_bytes(t.hbm_bytes)}, "
            f"{t.flops:.4g} FLOP, {t.rounds:g} rounds",
        ]
    )


# ---------------------------------------------------------------- commands


def _emit(args: argparse.Namespace, value: Any, text: str) -> None:
    if args.json:
        if isinstance(value, list):
            print(json.dumps([v.model_dump(mode="json") for v in value], indent=2))
        elif isinstance(value, BaseModel):
            print(value.model_dump_json(indent=2))
        else:
            print(json.dumps(value, indent=2))
    else:
        print(text)


def cmd_problems(args: argparse.Namespace) -> int:
    found = service.list_problems(args.category, args.text)
    rows = [[str(p.id), p.name, p.category, p.world_sizes, p.summary] for p in found]
    _emit(args, found, _table(rows, ["id", "name", "category", "world sizes", "summary"]))
    return EXIT_PASS


def cmd_show(args: argparse.Namespace) -> int:
    detail = service.show_problem(args.problem, args.world_size, args.size)
    text = _render_show(detail)
    if args.source:
        text += "\n\n" + detail.reference_source
    _emit(args, detail, text)
    return EXIT_PASS


def cmd_compile(args: argparse.Namespace) -> int:
    result = service.compile_file(Path(args.file))
    _emit(args, result, result.summary())
    return EXIT_PASS if result.ok else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    result = service.check(
        args.problem,
        Path(args.file),
        world_size=args.world_size,
        device=args.device,
        size=args.size,
        trials=args.trials,
        timeout_s=args.timeout,
        sandbox=args.sandbox,
        progress=_progress(args.json),
    )
    _emit(args, result, _render_check(result))
    return EXIT_PASS if result.verdict == "pass" else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    result = service.bench(
        args.problem,
        Path(args.file),
        world_size=args.world_size,
        device=args.device,
        size=args.size,
        timeout_s=args.timeout,
        sandbox=args.sandbox,
        progress=_progress(args.json),
    )
    _emit(args, result, _render_bench(result))
    return EXIT_PASS if result.verdict == "pass" else EXIT_FAILED


def cmd_roofline(args: argparse.Namespace) -> int:
    result = service.roofline_of(args.problem, args.world_size, args.size, args.time_ms)
    _emit(args, result, _render_roofline(result))
    return EXIT_PASS


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pkb", description="Multi-GPU kernel problems: check, benchmark, roofline.")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser, run: bool = False) -> None:
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("--world-size", type=int, default=4, help="number of ranks (default 4)")
        p.add_argument("--size", default="pkb", help="size preset: pkb (the original's) or large")
        if run:
            p.add_argument(
                "--device", choices=["cpu", "cuda"], default=None, help="cuda when a GPU is present, else cpu"
            )
            p.add_argument(
                "--timeout", type=float, default=None, help="wall-clock limit of each job, seconds"
            )
            p.add_argument("--sandbox", default="auto", help="isolation backend: auto or process")

    p = sub.add_parser("problems", help="list the problems")
    p.add_argument("--category")
    p.add_argument("--text", help="filter by text in name, summary, source or description")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_problems)

    p = sub.add_parser("show", help="a problem's contract, inputs and traffic")
    p.add_argument("problem", help="id or name")
    p.add_argument("--source", action="store_true", help="also print the reference source")
    common(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("compile", help="build a .cu file, or a solution's CUDA extensions, for sm_90a")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("check", help="correctness on every rank over several trials")
    p.add_argument("problem", help="id or name")
    p.add_argument("file", help="solution .py defining solution() with the reference's signature")
    p.add_argument("--trials", type=int, default=5)
    common(p, run=True)
    p.set_defaults(func=cmd_check, default_timeout=120.0)

    p = sub.add_parser("bench", help="time candidate and reference the same way; speedup and % of floor")
    p.add_argument("problem", help="id or name")
    p.add_argument("file", help="solution .py")
    common(p, run=True)
    p.set_defaults(func=cmd_bench, default_timeout=300.0)

    p = sub.add_parser("roofline", help="the problem's floor from its traffic and the node's ceilings")
    p.add_argument("problem", help="id or name")
    p.add_argument("--time-ms", type=float, default=None, help="a measured time to place against the floor")
    common(p)
    p.set_defaults(func=cmd_roofline)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log.configure(args.log_level)
    if getattr(args, "timeout", "absent") is None:
        args.timeout = args.default_timeout
    try:
        return int(args.func(args))
    except (UserError, ProblemFormatError) as exc:
        print(f"pkb: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pkb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
