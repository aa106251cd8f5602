"""The published MCP surface against its committed snapshot: tools (names, descriptions, schemas,
annotations), resources and resource templates, prompts (and one rendered prompt), and the server's
instructions. A change to any of them is a deliberate, reviewed diff: regenerate with

    PKB_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_mcp_snapshot.py

and review `git diff tests/snapshots/`. A missing snapshot fails (it is never written silently)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from pkb_mcp.frontends.server import build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore

pytestmark = [pytest.mark.contract, pytest.mark.anyio]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
# the order tools/list publishes, an agent's order of work (pkb_mcp/frontends/surface.py)
TOOLS = [
    "list_problems",
    "get_reference",
    "compile_kernel",
    "run_correctness",
    "benchmark",
    "profile",
    "roofline",
    "job_status",
    "job_result",
    "cancel_job",
]
HOUR_MS = 3_600_000


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def client(tmp_path):
    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    async with Client(build_server(scheduler, tmp_path / "sources")) as c:
        yield c
    scheduler.stop()


def matches_snapshot(name: str, published: Any) -> None:
    path = SNAPSHOTS / f"{name}.json"
    text = json.dumps(published, indent=2, sort_keys=True) + "\n"
    if os.environ.get("PKB_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} is missing: run with PKB_UPDATE_SNAPSHOTS=1 and review the new file"
    assert json.loads(path.read_text()) == published, (
        f"the published {name} changed: review it, then regenerate with PKB_UPDATE_SNAPSHOTS=1"
    )


async def test_tools(client):
    listed = await client.list_tools()
    published = {
        t.name: {
            "description": t.description,
            "input": t.input_schema,
            "output": t.output_schema,
            "annotations": t.annotations.model_dump(exclude_none=True) if t.annotations else None,
        }
        for t in sorted(listed.tools, key=lambda t: t.name)
    }
    matches_snapshot("tools", published)
    assert [t.name for t in listed.tools] == TOOLS  # in this order, whatever the order of registration
    assert (listed.ttl_ms, listed.cache_scope) == (HOUR_MS, "public")
    for name, tool in published.items():
        for param, schema in tool["input"].get("properties", {}).items():
            assert schema.get("description"), f"{name}.{param} has no description"
    # its size and portability: tests/test_schema_portability.py


async def test_resources_prompts_and_instructions(client):
    resources = await client.list_resources()
    templates = await client.list_resource_templates()
    prompts = await client.list_prompts()
    rendered = await client.get_prompt("attempt_problem", {"problem": "1", "world_size": "2"})
    published = {
        "instructions": client.instructions,
        "resources": [r.model_dump(mode="json", exclude_none=True) for r in resources.resources],
        "resource_templates": sorted(
            (t.model_dump(mode="json", exclude_none=True) for t in templates.resource_templates),
            key=lambda t: t["uriTemplate"] if "uriTemplate" in t else t["uri_template"],
        ),
        "prompts": [p.model_dump(mode="json", exclude_none=True) for p in prompts.prompts],
        "attempt_problem_1_w2": [m.content.text for m in rendered.messages],
    }
    matches_snapshot("surface", published)
    for listing in (resources, templates, prompts):
        assert (listing.ttl_ms, listing.cache_scope) == (HOUR_MS, "public")
    read = await client.read_resource("problem://1/reference")
    assert (read.ttl_ms, read.cache_scope) == (HOUR_MS, "private")  # job results are their submitter's
    assert client.instructions and "wait=false" in client.instructions
