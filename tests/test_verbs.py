"""A verb is one record (service.VERBS, issue 52): the MCP tools, their output models, task support
and order, and the CLI's run commands are read from its row, and a row they do not match is refused
when the server is built or the module imported."""

from __future__ import annotations

import dataclasses
from typing import get_args

import anyio
import pytest
from mcp import Client

from pkb_mcp import service
from pkb_mcp.frontends import server as mcp_server
from pkb_mcp.frontends import surface, tasks
from pkb_mcp.frontends.cli import build_parser
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.models import Kind, RunRequest

from .conftest import CANDIDATES


def _server(tmp_path):
    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    return mcp_server.build_server(scheduler, tmp_path / "sources"), scheduler


def test_the_rows_are_the_kinds_and_each_tool_is_published_in_order_with_tasks(tmp_path):
    assert list(service.VERBS) == list(get_args(Kind))
    server, scheduler = _server(tmp_path)

    async def listed():
        async with Client(server) as c:
            return [t.name for t in (await c.list_tools()).tools]

    try:
        names = anyio.run(listed)
    finally:
        scheduler.stop()
    tools = [verb.tool for verb in service.VERBS.values()]
    assert set(tools) <= set(names) and set(tools) <= set(surface.TOOL_ORDER)
    assert frozenset(tools) == tasks.TASK_TOOLS
    for kind, verb in service.VERBS.items():
        published = mcp_server.OUTPUTS[kind].model_fields["result"].annotation
        assert kind == "profile" or verb.result in get_args(published), (kind, published)


def test_a_row_without_a_kind_or_a_tool_is_refused(tmp_path, monkeypatch):
    extra = dataclasses.replace(service.VERBS["check"], tool="run_again", command="again")
    monkeypatch.setitem(service.VERBS, "again", extra)
    with pytest.raises(RuntimeError, match="disagree"):
        service._verbs_agree()
    with pytest.raises(RuntimeError, match=r"no MCP tool runs the verbs \['again'\]"):
        _server(tmp_path)
    monkeypatch.delitem(service.VERBS, "again")
    twin = dataclasses.replace(service.VERBS["bench"], tool="run_correctness")
    monkeypatch.setitem(service.VERBS, "bench", twin)
    with pytest.raises(RuntimeError, match="two verbs share a name"):
        service._verbs_agree()


def test_each_verb_s_command_runs_it_with_its_row_s_timeout(monkeypatch):
    """The CLI's run commands are the rows' (`args.verb`), and a command without --timeout gets its
    verb's limit (check 120 s, bench and profile 300 s)."""
    from pkb_mcp.frontends import cli

    parser = build_parser()
    file = str(CANDIDATES / "hangs.py")
    for kind, verb in service.VERBS.items():
        argv = [verb.command, file] if kind == "compile" else [verb.command, "1", file, "--device", "cpu"]
        args = parser.parse_args(argv)
        assert args.verb == kind
        request = cli._request(args)
        assert isinstance(request, RunRequest) and request.timeout_s == verb.timeout_s, kind
    assert service.VERBS["check"].timeout_s == 120.0 and service.VERBS["bench"].timeout_s == 300.0
    given = cli._request(parser.parse_args(["check", "1", file, "--timeout", "7"]))
    assert given.timeout_s == 7.0
