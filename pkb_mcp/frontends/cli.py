"""`pkb`: the command line over the service layer.

Readable tables by default, `--json` for scripts. Exit codes: 0 pass, 1 the candidate failed
(wrong, crashed, timed out, does not build), 2 bad input or environment. A user error is one
sentence on stderr (with --json: `{"error": sentence}` on stdout), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from pkb_mcp import catalogue, config, log, render
from pkb_mcp.catalogue import ProblemFormatError
from pkb_mcp.errors import UserError
from pkb_mcp.frontends import agents_cli
from pkb_mcp.models import (
    LAUNCHES_HELP,
    ConventionName,
    DeviceName,
    RunRequest,
    SandboxName,
    VariantName,
    choices,
)

if TYPE_CHECKING:
    from pkb_mcp import service

# The service, and torch below it, is imported by the commands that run something, not here: `pkb
# --help` and `pkb problems` answer without it (bench/scripts/cli_startup.py measures them).

EXIT_PASS, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    json_errors = False  # --json is on the command line: a refusal of its options is JSON too (main)

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.json_errors:
            print(json.dumps({"error": f"{message}; see pkb --help"}))
            self.exit(EXIT_USAGE)
        self.exit(EXIT_USAGE, f"pkb: {message}; see pkb --help\n")


def _progress(quiet: bool) -> service.Progress:
    def report(done: float, total: float | None, message: str) -> None:
        if not quiet:
            print(f"  [{done:g}/{total:g}] {message}" if total else f"  {message}", file=sys.stderr)

    return report


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
    found = catalogue.list_problems(args.category, args.text)
    _emit(args, found, render.problems(found))
    return EXIT_PASS


def cmd_show(args: argparse.Namespace) -> int:
    from pkb_mcp import service

    detail = service.show_problem(args.problem, args.world_size, args.size, args.variant)
    text = render.show(detail)
    if args.source:
        text += "\n\n" + detail.reference_source
    _emit(args, detail, text)
    return EXIT_PASS


# options whose names differ from the RunRequest fields they set
NO_WARM_HELP = "start every sandbox on demand instead of keeping a few started ahead of need"
NO_UNSEEN_HELP = (
    "skip the trial at a size the candidate was never shown (it runs after a passing check and reports "
    "'generalizes' apart from the verdict)"
)
_FIELD_OF_OPTION = {"file": "path", "timeout": "timeout_s", "out": "out_dir"}


def _request(args: argparse.Namespace) -> RunRequest:
    """A run command's request: each option given sets the RunRequest field of its name; the timeout
    not given is its verb's (service.VERBS, whose row names the command: `args.verb`)."""
    from pkb_mcp import service

    given = {_FIELD_OF_OPTION.get(name, name): value for name, value in vars(args).items()}
    if given.get("timeout_s") is None:
        given["timeout_s"] = service.VERBS[args.verb].timeout_s
    return RunRequest.of(**{k: v for k, v in given.items() if k in RunRequest.model_fields and v is not None})


def cmd_compile(args: argparse.Namespace) -> int:
    from pkb_mcp import service

    result = service.compile_file(_request(args))
    _emit(args, result, service.VERBS["compile"].text(result, None))
    return EXIT_PASS if result.ok else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    from pkb_mcp import service
    from pkb_mcp.agents import trail

    call = trail.record_cli_call("check", Path(args.file))  # in an agent run's shell (agents/trail.py)
    result = service.check(_request(args), service.JobContext(_progress(args.json)))
    trail.record_cli_result(call, result.verdict == "pass", None)
    _emit(args, result, service.VERBS["check"].text(result, None))
    return EXIT_PASS if result.verdict == "pass" else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    from pkb_mcp import service
    from pkb_mcp.agents import trail

    call = trail.record_cli_call("bench", Path(args.file))
    result = service.bench(_request(args), service.JobContext(_progress(args.json)))
    trail.record_cli_result(
        call, result.verdict in ("pass", "suspect"), result.speedup if result.verdict == "pass" else None
    )
    _emit(args, result, service.VERBS["bench"].text(result, None))
    return EXIT_PASS if result.verdict == "pass" else EXIT_FAILED


def cmd_profile(args: argparse.Namespace) -> int:
    from pkb_mcp import service

    result = service.profile(_request(args), service.JobContext(_progress(args.json)))
    _emit(args, result, service.VERBS["profile"].text(result, None))
    return EXIT_PASS if result.verdict == "ok" else EXIT_FAILED


class _Bar:
    """`pkb eval`'s progress on stderr: a bar redrawn in place on a terminal, else a line per event."""

    WIDTH = 24

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, file: str, message: str) -> None:
        if self.quiet:
            return
        filled = self.WIDTH * done // max(total, 1)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total}  {file}: {message}"
        if self.tty:
            print("\r\033[K" + line[:160], end="\n" if done == total else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def cmd_eval(args: argparse.Namespace) -> int:
    from pkb_mcp.evaluation import report as eval_report
    from pkb_mcp.evaluation.batch import evaluate
    from pkb_mcp.evaluation.records import CANDIDATE_FAILURES

    report = evaluate(
        args.paths,
        world_size=args.world_size,
        device=args.device,
        size=args.size,
        variant=args.variant,
        trials=args.trials,
        timeout_s=args.timeout,
        bench_timeout_s=args.bench_timeout,
        sandbox=args.sandbox,
        convention=args.convention,
        bench=not args.no_bench,
        unseen=args.unseen,
        rerun=args.rerun,
        attempts=args.attempts,
        store=Path(args.store) if args.store else None,
        out_dir=Path(args.out) if args.out else config.state_dir() / "eval",
        progress=_Bar(args.json),
        ray=args.ray,
        warm=not args.no_warm,
    )
    text = eval_report.to_markdown(report)
    text += "".join(f"\n{fmt}: {path}" for fmt, path in report.reports.items())
    text += "".join(f"\nnote: {n}" for n in report.notes)
    _emit(args, report, text)
    outcomes = report.summary.outcomes
    if outcomes.get("env"):
        return EXIT_USAGE
    return EXIT_FAILED if any(outcomes.get(k) for k in CANDIDATE_FAILURES) else EXIT_PASS


def cmd_roofline(args: argparse.Namespace) -> int:
    from pkb_mcp import service

    result = service.roofline_of(args.problem, args.world_size, args.size, args.time_ms, args.variant)
    _emit(args, result, render.roofline(result))
    return EXIT_PASS


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pkb_mcp import service

    result = service.calibrate(args.world_size, args.device)
    _emit(args, result, render.calibration(result))
    return EXIT_PASS


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_doctor(args: argparse.Namespace) -> int:
    from pkb_mcp.frontends import doctor

    report = doctor.examine(sweep=not args.no_sweep)
    _emit(args, report.as_json(), doctor.text(report))
    return EXIT_FAILED if report.failed else EXIT_PASS


def cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from pkb_mcp import service
    from pkb_mcp.frontends.server import build_server
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore

    token = args.token or os.environ.get("PKB_TOKEN")
    if args.transport == "http" and not token and args.host not in LOOPBACK:
        raise UserError(f"refusing to listen on {args.host} without a token; pass --token or set PKB_TOKEN")
    if args.transport == "http" and not args.allow_process_sandbox:
        from sandbox import select_backend

        if select_backend("auto").name == "process":
            raise UserError(
                "no Docker engine answers, and serving over HTTP with the process backend would run "
                "remote code unisolated; start Docker, or pass --allow-process-sandbox"
            )
    roots = config.mcp_roots(args.root or ())  # before anything starts: a folder that is none is refused
    state = config.state_dir()
    gpus = 0
    if service.default_device() == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    cluster = None
    if args.ray:
        from pkb_mcp.jobs.cluster import RayCluster

        cluster = RayCluster(args.ray)  # the sandboxes are the nodes': no local warm pool below
        args.no_warm = True
    scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus, cluster=cluster)
    server = build_server(scheduler, state / "sources", roots)
    from sandbox import reaper
    from sandbox.docker import OWNER_LABEL, owner_id

    reaper.watch(OWNER_LABEL, owner_id())  # its sandboxes removed even if it is killed (SIGKILL)
    if not args.no_warm:
        from pkb_mcp.launches import enable_warm_pool, warm_key
        from sandbox import select_backend

        # the most likely first job: every GPU of the node (world size 4 where there are more)
        n = 4 if gpus >= 4 else gpus
        backend = select_backend("auto")
        enable_warm_pool(backend, warm_key("cuda", list(range(n)), n, 1) if n >= 2 else None)
        # and torch's header precompiled for extension builds with default flags (compile/headers.py)
        from pkb_mcp.compile import headers
        from pkb_mcp.launches import ToolLaunches

        headers.prepare_soon(headers.default_sets(), ToolLaunches(backend))
    stopping = StopOnSignals()
    code = EXIT_PASS
    try:
        if args.transport == "stdio":
            anyio.run(server.run_stdio_async)
        else:
            import uvicorn

            from pkb_mcp.frontends.httpauth import BearerAuth

            app: Any = server.streamable_http_app(host=args.host)
            if token:
                app = BearerAuth(app, token)
            print(f"pkb: serving MCP on http://{args.host}:{args.port}/mcp", file=sys.stderr)
            uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    except KeyboardInterrupt:
        pass  # SIGINT, SIGTERM or SIGHUP: a client stopping its server; the end below is the same
    except Exception as exc:  # the end below runs first; then the exit says it failed
        print(f"pkb: the server stopped on an error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    finally:
        stopping.ending()
        _end_serving(scheduler)
        # and leave now: a thread of the stdio transport may still wait in a read of stdin, which the
        # interpreter's exit would wait for (until the client's next signal killed it)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


SERVE_END_S = 30.0  # a stopping server is gone within this, whatever it was doing


class StopOnSignals:
    """How `pkb serve` takes a client's stop: SIGINT, SIGTERM and SIGHUP each end the serving loop
    (as a KeyboardInterrupt), and once the end has begun (`ending`) no signal can cut it short, so
    the sandboxes are always removed: Claude Code sends SIGINT and, 100 ms later, SIGTERM, which
    used to kill the server before it removed them. Past SERVE_END_S the process exits anyway."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.ended = threading.Event()
        for signum in self.SIGNALS:
            signal.signal(signum, self._stop)

    def _stop(self, signum: int, frame: object) -> None:
        if not self.ended.is_set():
            raise KeyboardInterrupt(signal.Signals(signum).name)

    def ending(self) -> None:
        self.ended.set()
        for signum in self.SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        watchdog = threading.Timer(SERVE_END_S, os._exit, args=(EXIT_USAGE,))
        watchdog.daemon = True
        watchdog.start()


def _end_serving(scheduler: Any) -> None:
    """A server's end: running jobs cancelled (queued again for the next start, never given a
    verdict) and awaited, then every sandbox and launch directory of this process removed."""
    from pkb_mcp.launches import end_launches
    from sandbox import made_backends

    t0 = time.monotonic()
    scheduler.stop(wait_s=SERVE_END_S / 3)
    ended = sum(end_launches(backend, SERVE_END_S / 3) for backend in made_backends())
    log.get(__name__).info("serve.ended", sandboxes=ended, end_s=round(time.monotonic() - t0, 3))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pkb", description="Multi-GPU kernel problems: check, benchmark, profile, roofline."
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_catalogue(sub)
    _add_runs(sub)
    _add_eval(sub)
    _add_node(sub)
    agents_cli.add(sub)
    p = sub.add_parser(
        "doctor",
        help="check this machine for pkb, remove what dead pkb processes left, print each client's set-up",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-sweep", action="store_true", help="remove nothing")
    p.set_defaults(func=cmd_doctor)
    return parser


def _common(p: argparse.ArgumentParser, run: bool = False) -> None:
    """The options every problem command takes; `run`: those of commands that run launches."""
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--world-size", type=int, default=4, help="number of ranks (default 4)")
    p.add_argument("--size", default="pkb", help="size preset: pkb (the original's) or large")
    p.add_argument(
        "--variant",
        choices=choices(VariantName),
        default="pkb",
        help="the workload: pkb's (default), or the original benchmark's exactly (docs/variants.md)",
    )
    if run:
        p.add_argument(
            "--device", choices=choices(DeviceName), default=None, help="cuda when a GPU is present, else cpu"
        )
        p.add_argument("--timeout", type=float, default=None, help="wall-clock limit of each launch, seconds")
        p.add_argument(
            "--sandbox",
            choices=choices(SandboxName),
            default="auto",
            help="isolation: docker, process (no isolation), auto (docker when an engine answers)",
        )
        p.add_argument(
            "--convention",
            choices=choices(ConventionName),
            default="auto",
            help="how solution() is called: ours, the original benchmark's, or auto (from its signature)",
        )


def _add_catalogue(sub: Any) -> None:
    """problems, show: the suite, read without running anything."""
    p = sub.add_parser("problems", help="list the problems")
    p.add_argument("--category")
    p.add_argument("--text", help="filter by text in name, summary, source or description")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_problems)

    p = sub.add_parser("show", help="a problem's contract, inputs and traffic")
    p.add_argument("problem", help="id or name")
    p.add_argument("--source", action="store_true", help="also print the reference source")
    _common(p)
    p.set_defaults(func=cmd_show)


def _add_runs(sub: Any) -> None:
    """compile, check, bench, profile: one solution, in sandboxed launches."""
    p = sub.add_parser("compile", help="build a .cu file, or a solution's CUDA extensions, for sm_90a")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--sandbox",
        choices=choices(SandboxName),
        default="auto",
        help="where the solution is imported and the compilers run (as for check)",
    )
    p.set_defaults(func=cmd_compile, verb="compile")

    p = sub.add_parser("check", help="correctness on every rank over several trials")
    p.add_argument("problem", help="id or name")
    p.add_argument("file", help="solution .py defining solution() with the reference's signature")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--no-unseen", dest="unseen", action="store_const", const=False, help=NO_UNSEEN_HELP)
    _common(p, run=True)
    p.set_defaults(func=cmd_check, verb="check")

    p = sub.add_parser("bench", help="time candidate and reference the same way; speedup and %% of floor")
    p.add_argument("problem", help="id or name")
    p.add_argument("file", help="solution .py")
    p.add_argument(
        "--launches",
        "--jobs",  # its name until launches were called launches; kept so that older commands run
        dest="launches",
        type=int,
        default=1,
        help=LAUNCHES_HELP.replace("%", "%%"),  # argparse formats help with %
    )
    _common(p, run=True)
    p.set_defaults(func=cmd_bench, verb="bench")

    p = sub.add_parser(
        "profile", help="where each rank's time goes in a call: communication, compute, overlap, gaps"
    )
    p.add_argument("problem", help="id or name")
    p.add_argument("file", help="solution .py")
    p.add_argument("--calls", type=int, default=3, help="calls profiled per side after warm-up (default 3)")
    p.add_argument(
        "--out", default=None, help="folder for trace.json and timeline.png (default: under the state dir)"
    )
    _common(p, run=True)
    p.set_defaults(func=cmd_profile, verb="profile")


def _add_eval(sub: Any) -> None:
    """eval: a batch of solution files."""
    p = sub.add_parser(
        "eval",
        help="check and benchmark a batch of solution files (directories, globs); report and scores",
        description="Each file (named NNN_slug.py or the original's {id}_{name}_{backend}.py) is checked "
        "and, if correct, benchmarked in sandboxed launches of its own; results are kept in a SQLite store, "
        "so a re-run resumes. Writes report.json, report.csv, report.md and report.png into --out, with the "
        "published table: correct and fast_1 per category of the original benchmark and overall, over the "
        "whole suite, and best of k with --attempts.",
    )
    p.add_argument("paths", nargs="+", help="solution files, directories of them, or globs")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument(
        "--bench-timeout",
        type=float,
        default=300.0,
        help="wall-clock limit of each benchmark launch, seconds",
    )
    p.add_argument("--no-bench", action="store_true", help="check only: no speedups, only fast_0")
    p.add_argument("--no-unseen", dest="unseen", action="store_const", const=False, help=NO_UNSEEN_HELP)
    p.add_argument("--rerun", action="store_true", help="run every file again, even those already done")
    p.add_argument(
        "--attempts",
        action="store_true",
        help="each PATH is one attempt of the whole set by one model (a directory of its files): the "
        "published table gives best of k over them",
    )
    p.add_argument("--store", default=None, help="the SQLite store (default $PKB_STATE_DIR/eval.sqlite)")
    p.add_argument(
        "--out", default=None, help="directory for the reports (default: eval/ under the state dir)"
    )
    p.add_argument(
        "--ray", default=None, metavar="ADDRESS", help="run the jobs on this Ray cluster (docs/scale-out.md)"
    )
    p.add_argument("--no-warm", action="store_true", help=NO_WARM_HELP)
    _common(p, run=True)
    p.set_defaults(func=cmd_eval, default_timeout=120.0)


def _add_node(sub: Any) -> None:
    """roofline, calibrate, serve: the node's floor and ceilings, and the MCP server."""
    p = sub.add_parser("roofline", help="the problem's floor from its traffic and the node's ceilings")
    p.add_argument("problem", help="id or name")
    p.add_argument("--time-ms", type=float, default=None, help="a measured time to place against the floor")
    _common(p)
    p.set_defaults(func=cmd_roofline)

    p = sub.add_parser("calibrate", help="measure this node's ceilings for the roofline and save them")
    p.add_argument("--world-size", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument(
        "--device", choices=choices(DeviceName), default=None, help="cpu: a dry run, nothing saved"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("serve", help="run the MCP server (stdio, or streamable HTTP with a bearer token)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")
    p.add_argument("--token", default=None, help="http: bearer token clients must send (or env PKB_TOKEN)")
    p.add_argument(
        "--allow-process-sandbox",
        action="store_true",
        help="http: serve even when only the (non-isolating) process backend is available",
    )
    p.add_argument("--no-warm", action="store_true", help=NO_WARM_HELP)
    p.add_argument(
        "--ray", default=None, metavar="ADDRESS", help="run the jobs on this Ray cluster (docs/scale-out.md)"
    )
    p.add_argument(
        "--root",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder whose files a tool's path may name (repeatable; replaces PKB_ROOTS and the default, "
        "the working directory; the state folder is always one)",
    )
    p.set_defaults(func=cmd_serve)


def _finish_headers(args: argparse.Namespace) -> None:
    """Wait for a precompiled header that a build of this command asked for (compile/headers.py), so
    that the next command finds it; only where a build ran (its module is loaded)."""
    found = sys.modules.get("pkb_mcp.compile.headers")
    if found is not None:
        quiet = getattr(args, "json", False)
        found.finish(lambda why: None if quiet else print(f"pkb: {why}", file=sys.stderr))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in given
    args = parser.parse_args(given)
    log.configure(args.log_level)
    if getattr(args, "timeout", "absent") is None and hasattr(args, "default_timeout"):
        args.timeout = args.default_timeout  # pkb eval's
    try:
        code = int(args.func(args))
        if args.func is not cmd_serve:
            _finish_headers(args)
        return code
    except (UserError, ProblemFormatError) as exc:
        if getattr(args, "json", False):  # a script reads stdout: the error there, as the tools' shape
            print(json.dumps({"error": str(exc)}))
        else:
            print(f"pkb: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("pkb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`pkb show 1 | head`): what is left goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so exit's flush cannot raise
        return 141  # as a shell reports a process a SIGPIPE ended


if __name__ == "__main__":
    sys.exit(main())
