"""The MCP `profile` tool's wall time on this node (issue 22): one call through an in-process server,
problem 12 at size large, examples/012 as the candidate. Prints the wall time and the tool's text."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client

from pkb_mcp.frontends.server import build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore

ROOT = Path(__file__).resolve().parents[2]


async def main(world_size: int, size: str) -> None:
    import torch

    state = Path(tempfile.mkdtemp(prefix="pkb-profile-wall-"))
    scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus=torch.cuda.device_count())
    try:
        async with Client(build_server(scheduler, state / "sources")) as client:
            args = {
                "problem": 12,
                "path": str(ROOT / "examples" / "012_allgather_gemm_overlap.py"),
                "world_size": world_size,
                "size": size,
                "device": "cuda",
            }
            t0 = time.monotonic()
            got = await client.call_tool("profile", args)
            wall = time.monotonic() - t0
            text = "\n".join(block.text for block in got.content if block.type == "text")
            where = f"problem 12 {size}, examples/012, world size {world_size}"
            print(f"MCP profile tool, {where}: {wall:.1f} s wall")
            print(text)
    finally:
        scheduler.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--size", default="large")
    args = parser.parse_args()
    anyio.run(main, args.world_size, args.size)
