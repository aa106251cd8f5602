"""The published tools/list against the rules every client maps (pkb_mcp/frontends/schemas.py): no
`type` array, one type per argument, a typed node everywhere, and a size every agent can carry. The
published output schemas still accept what the tools return: clients validate structuredContent
against them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from mcp import Client

from pkb_mcp.frontends.schemas import one_type, published_input, published_output
from pkb_mcp.frontends.server import OUTPUTS, AnyJobOutput, build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.models import BenchResult, CheckResult, RankResult, SandboxInfo

pytestmark = [pytest.mark.contract, pytest.mark.anyio]
# bytes of tools/list on the wire: every agent carries them in its context (24,554 with the variant
# argument on five tools, 2026-11-26; 24,868 with `protections` on check and bench results; 25,515
# with the check's unseen-size trial; 25,852 with list_problems' paging and `detail`; 25,996 with
# `type` arrays and output schemas of every depth, 2026-12-02; 18,737 portable, two objects deep;
# 19,217 with what binds the floor and the exchange's shares of it, 2026-12-03)
TOOLS_LIST_LIMIT = 20_000
# keywords whose value is a map of names to schemas, one schema, or a list of schemas
_MAPS, _ONE, _LISTS = ("properties", "$defs", "patternProperties"), ("items", "not"), ("anyOf", "oneOf")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def listed(tmp_path):
    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    async with Client(build_server(scheduler, tmp_path / "sources")) as c:
        yield await c.list_tools()
    scheduler.stop()


def nodes(schema: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node under `schema`, with its path."""
    yield where, schema
    for key in _MAPS:
        for name, sub in schema.get(key, {}).items():
            yield from nodes(sub, f"{where}.{key}.{name}")
    for key in (*_ONE, "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{where}.{key}")
    for key in _LISTS:
        for i, sub in enumerate(schema.get(key, [])):
            yield from nodes(sub, f"{where}.{key}[{i}]")


def unportable(schema: dict[str, Any], where: str) -> list[str]:
    """What a client with a one-type dialect cannot map: a `type` array, a node with neither one type
    nor branches of one type each, a boolean schema, a `oneOf`/`allOf`, a reference."""
    found = []
    for path, node in nodes(schema, where):
        if not isinstance(node, dict):
            found.append(f"{path}: a boolean schema")
            continue
        kind = node.get("type")
        if isinstance(kind, list):
            found.append(f"{path}: type array {kind}")
        elif not isinstance(kind, str) and "anyOf" not in node:
            found.append(f"{path}: no type")
        if "anyOf" in node and ("type" in node or not all("type" in b for b in node["anyOf"])):
            found.append(f"{path}: anyOf whose branches are not one type each")
        found += [f"{path}: {key}" for key in ("oneOf", "allOf", "$ref") if key in node]
    return found


async def test_every_schema_is_portable(listed):
    found = []
    for tool in listed.tools:
        found += unportable(tool.input_schema, f"{tool.name}.inputSchema")
        for name, prop in tool.input_schema.get("properties", {}).items():
            if not isinstance(prop.get("type"), str) or "anyOf" in prop:
                found.append(f"{tool.name}.inputSchema.{name}: an argument of other than one type")
        if tool.output_schema is not None:
            found += unportable(tool.output_schema, f"{tool.name}.outputSchema")
    assert not found, "\n".join(found)


async def test_tools_list_is_small_enough_for_every_agent(listed):
    wire = len(listed.model_dump_json(by_alias=True, exclude_none=True).encode())
    assert wire < TOOLS_LIST_LIMIT, f"tools/list is {wire} bytes, over {TOOLS_LIST_LIMIT}"
    for tool in listed.tools:
        assert tool.output_schema is not None, f"{tool.name} lost its structured output"


async def test_what_an_agent_reads_is_published(listed):
    tools = {t.name: t for t in listed.tools}
    result = tools["benchmark"].output_schema["properties"]["result"]["anyOf"][0]["properties"]
    for field in ("verdict", "message", "speedup", "speedup_low", "speedup_high", "within_noise"):
        assert result[field].get("description") or field in ("message",), field
    check = tools["run_correctness"].output_schema["properties"]["result"]["anyOf"][0]["properties"]
    assert {"verdict", "message", "ranks", "generalizes"} <= set(check)
    assert "every rank" in tools["benchmark"].output_schema["properties"]["result_uri"]["description"]


def test_optional_arguments_publish_one_type_and_keep_their_meaning():
    schema = {
        "title": "fArguments",
        "properties": {
            "p": {"anyOf": [{"type": "integer"}, {"type": "string"}], "title": "P"},
            "d": {"anyOf": [{"enum": ["cpu", "cuda"], "type": "string"}, {"type": "null"}], "default": None},
            "t": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}], "description": "x"},
            "mixed": {"anyOf": [{"enum": ["a"], "type": "string"}, {"type": "integer"}]},
        },
    }
    lean = published_input(schema)
    assert "title" not in lean
    assert lean["properties"]["p"] == {"type": "string"}  # the server reads digits as an id
    assert lean["properties"]["d"] == {"enum": ["cpu", "cuda"], "type": "string"}
    assert lean["properties"]["t"] == {"type": "number", "exclusiveMinimum": 0, "description": "x"}
    assert lean["properties"]["mixed"] == schema["properties"]["mixed"], "left for the test to name"
    assert one_type({"type": "boolean", "default": False}) == {"type": "boolean", "default": False}


async def test_null_and_an_integer_id_are_still_accepted(tmp_path):
    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    async with Client(build_server(scheduler, tmp_path / "sources")) as c:
        page = await c.call_tool("list_problems", {"category": None, "text": None, "limit": 2})
        ref = await c.call_tool("get_reference", {"problem": 1, "world_size": 2})
        roof = await c.call_tool("roofline", {"problem": "1", "world_size": 2, "time_ms": None})
    scheduler.stop()
    assert not page.is_error and not ref.is_error and not roof.is_error
    assert ref.structured_content["id"] == 1


def _sandbox() -> SandboxInfo:
    return SandboxInfo(backend="process", isolated=False)


@pytest.mark.parametrize(
    "output",
    [
        OUTPUTS["bench"](job_id="j", state="queued", result_uri="pkb://jobs/j/result"),
        OUTPUTS["bench"](
            job_id="j",
            state="done",
            result_uri="pkb://jobs/j/result",
            result=BenchResult(
                problem_id=1,
                problem="allreduce",
                world_size=2,
                size="pkb",
                device="cpu",
                verdict="fail",
                message="rank 1 crashed",
                ranks=[RankResult(rank=1, state="crashed")],
                wall_s=1.0,
                sandbox=_sandbox(),
            ),
        ),
        OUTPUTS["check"](
            job_id="j",
            state="done",
            result_uri="pkb://jobs/j/result",
            result=CheckResult(
                problem_id=1,
                problem="allreduce",
                world_size=2,
                size="pkb",
                device="cpu",
                trials=1,
                verdict="pass",
                message="all 2 ranks match the reference",
                ranks=[RankResult(rank=0, state="pass")],
                wall_s=1.0,
                sandbox=_sandbox(),
            ),
        ),
        OUTPUTS["profile"](job_id="j", state="running", result_uri="pkb://jobs/j/result"),
        AnyJobOutput(job_id="j", state="done", result_uri="pkb://jobs/j/result", kind="bench", result={}),
    ],
    ids=["queued", "bench", "check", "profile", "any"],
)
def test_published_output_schemas_accept_the_results_with_their_nulls(output):
    schema = published_output(type(output).model_json_schema())
    jsonschema.validate(output.model_dump(mode="json"), schema)
