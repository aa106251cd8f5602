"""`pkb agents run` and `pkb export harbor`: the command lines over pkb_mcp/agents (docs/agents.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pkb_mcp.models import DeviceName, VariantName, choices

EXIT_PASS = 0


def add(sub: Any) -> None:
    agents = sub.add_parser("agents", help="evaluate a coding agent on problems (docs/agents.md)")
    verbs = agents.add_subparsers(dest="agents_command", required=True, parser_class=type(agents))
    p = verbs.add_parser(
        "run",
        help="each problem's attempts by an agent, each in a workspace of its own; judged and tabled",
        description="Runs the agent's client headless once per problem and attempt, in a fresh workspace "
        "with pkb's MCP server (or, with --tools cli, the pkb command), collects solution.py, then judges "
        "every file with pkb eval and writes pass@k, the published table and correct-against-steps.",
    )
    p.add_argument(
        "--agent", required=True, help="claude, codex, gemini, cursor, or cmd:TEMPLATE (a shell line)"
    )
    p.add_argument("--model", default=None, help="the model the client uses (default: the client's)")
    p.add_argument("--problems", default="all", help="ids, ranges (1-10), categories, names or all")
    p.add_argument("--attempts", type=int, default=1, help="attempts per problem (k)")
    p.add_argument("--variant", choices=choices(VariantName), default="pkb")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--size", default="pkb")
    p.add_argument("--device", choices=choices(DeviceName), default=None, help="cuda when a GPU is present")
    p.add_argument(
        "--tools", choices=["mcp", "cli"], default="mcp", help="pkb's MCP tools, or a shell with pkb"
    )
    p.add_argument(
        "--agent-sandbox",
        choices=["docker", "none"],
        default="docker",
        help="docker: the client in a container of its own (default); none: as you, no isolation",
    )
    p.add_argument("--max-turns", type=int, default=None, help="where the client has a turn limit")
    p.add_argument("--max-usd", type=float, default=None, help="where the client has a spending limit")
    p.add_argument("--wall", type=float, default=1800.0, help="seconds an attempt may take (always enforced)")
    p.add_argument("--concurrency", type=int, default=1, help="attempts at once")
    p.add_argument("--out", required=True, help="the run's folder (a rerun with the same one resumes)")
    p.add_argument(
        "--pass-env", action="append", default=[], metavar="NAME",
        help="a variable of yours the client in a container gets (its provider's are passed already)",
    )  # fmt: skip
    p.add_argument("--no-judge", action="store_true", help="collect the files only; judge later")
    p.add_argument("--json", action="store_true", help="print the run's result as JSON")
    p.set_defaults(func=cmd_agents_run)

    export = sub.add_parser("export", help="the problems as tasks of another evaluation engine")
    kinds = export.add_subparsers(dest="export_kind", required=True, parser_class=type(export))
    h = kinds.add_parser("harbor", help="one Harbor task per problem (docs/harbor.md)")
    h.add_argument("dir", help="the folder to write the tasks into")
    h.add_argument("--problems", default="all", help="ids, ranges (1-10), categories, names or all")
    h.add_argument("--variant", choices=choices(VariantName), default="pkb")
    h.add_argument("--world-size", type=int, default=4)
    h.add_argument("--size", default="pkb")
    h.add_argument("--device", choices=choices(DeviceName), default="cuda")
    h.add_argument("--image", default=None, help="the environment's image (default: see docs/harbor.md)")
    h.add_argument("--mcp-url", default=None, help="pkb's MCP server as the agent reaches it")
    h.set_defaults(func=cmd_export_harbor)


def cmd_agents_run(args: argparse.Namespace) -> int:
    from pkb_mcp import service
    from pkb_mcp.agents.records import AgentSettings
    from pkb_mcp.agents.run import run_agents, select_problems

    settings = AgentSettings(
        agent=args.agent,
        model=args.model,
        problems=select_problems(args.problems, args.variant),
        attempts=args.attempts,
        variant=args.variant,
        world_size=args.world_size,
        size=args.size,
        device=args.device or service.default_device(),
        tools=args.tools,
        agent_sandbox=args.agent_sandbox,
        max_turns=args.max_turns,
        max_usd=args.max_usd,
        wall_s=args.wall,
        concurrency=args.concurrency,
    )
    say = (lambda _: None) if args.json else (lambda line: print(f"pkb: {line}", file=sys.stderr))
    run = run_agents(
        settings, Path(args.out), judge=not args.no_judge, pass_env=tuple(args.pass_env), say=say
    )
    if args.json:
        print(run.model_dump_json(indent=2))
    else:
        print(Path(run.reports["md"]).read_text())
    return EXIT_PASS


def cmd_export_harbor(args: argparse.Namespace) -> int:
    from pkb_mcp.agents.harbor import export_tasks
    from pkb_mcp.agents.run import select_problems

    written = export_tasks(
        Path(args.dir),
        select_problems(args.problems, args.variant),
        variant=args.variant,
        world_size=args.world_size,
        size=args.size,
        device=args.device,
        image=args.image,
        mcp_url=args.mcp_url,
    )
    print(f"pkb: {len(written)} Harbor task(s) in {args.dir}")
    return EXIT_PASS
