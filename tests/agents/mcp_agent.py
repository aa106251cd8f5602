"""A scripted agent for `pkb agents run --agent cmd:...` tests: it reads the MCP configuration the run
gives it (`$PKB_MCP_CONFIG`, `.mcp.json` form), lists pkb's tools, writes solution.py from the file
named on its command line, calls run_correctness on it and ends, printing one JSON line per step (its
transcript). With `--hang` it sleeps instead (killed at the wall limit), with `--no-file` it writes
nothing, with `--no-mcp` it never connects."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import anyio


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main(args: argparse.Namespace) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    entry = json.loads(Path(os.environ["PKB_MCP_CONFIG"]).read_text())["mcpServers"]["pkb"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"])
    async with Client(params) as client:
        tools = await client.list_tools()
        say(type="tools", names=sorted(t.name for t in tools.tools))
        if args.no_file:
            return
        target = Path.cwd() / "solution.py"
        shutil.copyfile(args.source, target)
        say(type="tool_use", name="write", path=str(target))
        r = await client.call_tool(
            "run_correctness",
            {"problem": os.environ["PKB_PROBLEM"], "path": str(target), "world_size": 2, "device": "cpu",
             "trials": 1},
        )  # fmt: skip
        say(type="tool_use", name="run_correctness", verdict=(r.structured_content or {}).get("result", {}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("source", nargs="?")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--no-file", action="store_true")
    parser.add_argument("--no-mcp", action="store_true")
    args = parser.parse_args()
    if args.hang:
        say(type="hanging")
        os.system("setsid sleep 600 &")  # a child that leaves the group: ended by the marker
        time.sleep(600)
    elif args.no_mcp:
        shutil.copyfile(args.source, "solution.py")
    else:
        anyio.run(main, args)
    sys.exit(0)
