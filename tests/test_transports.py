"""The server over real transports: stdio in a subprocess (only protocol on stdout) and streamable
HTTP with a bearer token (refused without it; refused on a public address without a token)."""

import os
import socket
import subprocess
import sys
import time

import httpx2 as httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from pkb_mcp.frontends.cli import main

from .conftest import ROOT
from .tasks_client import Tasks

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def server_env(tmp_path):
    env = dict(os.environ)
    env.update({"PKB_STATE_DIR": str(tmp_path / "state"), "PKB_LAUNCH_DIR": str(tmp_path / "launches")})
    (tmp_path / "launches").mkdir(exist_ok=True)
    return env


async def test_stdio_subprocess_lists_tools_and_runs_a_check_as_a_task(tmp_path):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "pkb_mcp", "serve"],
        env=server_env(tmp_path),
        cwd=str(ROOT),
    )
    tasks = Tasks()  # the client declares the tasks extension: the check comes back as a task
    async with Client(params, extensions=[tasks]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "run_correctness" in names
        r = await client.call_tool(
            "run_correctness",
            {
                "problem": "1",
                "path": "problems/001_allreduce.py",
                "world_size": 2,
                "trials": 1,
                "device": "cpu",
            },
        )
        assert r.structured_content["result"]["verdict"] == "pass", r.content
    assert len(tasks.handles) == 1 and tasks.polls[-1]["status"] == "completed"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_http_needs_the_bearer_token(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pkb_mcp",
            "serve",
            "--transport",
            "http",
            "--port",
            str(port),
            "--token",
            "s3cret",
        ],
        env=server_env(tmp_path),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(900):  # the server imports torch first: slow on a loaded 2-core machine
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        denied = httpx.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert denied.status_code == 401
        # httpx waits 5 s for a response by default; a loaded 2-core machine can take longer
        client_http = httpx.AsyncClient(headers={"Authorization": "Bearer s3cret"}, timeout=120)
        from mcp.client.streamable_http import streamable_http_client

        tasks = Tasks()
        async with Client(streamable_http_client(url, http_client=client_http), extensions=[tasks]) as client:
            listed = await client.call_tool("list_problems", {"text": "allreduce"})
            assert 1 in {p["id"] for p in listed.structured_content["problems"]}
            run = {"problem": "1", "path": "problems/001_allreduce.py", "world_size": 2, "trials": 1}
            r = await client.call_tool("run_correctness", {**run, "device": "cpu", "sandbox": "process"})
            assert r.structured_content["result"]["verdict"] == "pass", r.content
        assert len(tasks.handles) == 1 and tasks.polls[-1]["status"] == "completed"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_http_on_a_public_address_needs_a_token(capsys, monkeypatch):
    monkeypatch.delenv("PKB_TOKEN", raising=False)
    assert main(["serve", "--transport", "http", "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err
