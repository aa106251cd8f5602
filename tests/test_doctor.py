"""`pkb doctor` (pkb_mcp/frontends/doctor.py): its findings, the set-up it prints for each client,
checked by each installed client's own health check against `pkb serve`, and its sweep of what pkb
processes that are gone left (a live server's sandboxes stay)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import tomllib

import pytest

from pkb_mcp.agents.clients import TOOL_TIMEOUT_S
from pkb_mcp.frontends import doctor

from .conftest import ROOT


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _setup(report: doctor.Report, client: str) -> doctor.Setup:
    return next(s for s in report.setups if s.client == client)


def test_the_report_names_each_part_of_the_machine_and_each_client(state):
    report = doctor.examine(sweep=False)
    assert [f.name for f in report.findings] == ["docker", "gpus", "nvcc", "state", "node"]
    assert all(f.status in ("ok", "warn", "fail") and f.detail for f in report.findings)
    assert [s.client for s in report.setups] == [
        "Claude Code",
        "Codex",
        "Gemini CLI",
        "Cursor",
        "MCP Inspector",
    ]
    assert report.server["env"]["PKB_STATE_DIR"] == str(state) and report.server["command"] == sys.executable
    json.dumps(report.as_json())  # --json prints it


def test_each_set_up_is_in_its_client_s_own_format_with_pkb_s_environment_spelled_out(state):
    report = doctor.examine(sweep=False)
    argv = shlex.split(_setup(report, "Claude Code").text)
    assert argv[:5] == ["claude", "mcp", "add-json", "--scope", "user"] and argv[5] == "pkb"
    claude = json.loads(argv[6])
    assert claude["timeout"] == TOOL_TIMEOUT_S * 1000  # a field of the server, not a variable of it
    assert "MCP_TOOL_TIMEOUT" not in claude["env"] and claude["env"]["PKB_STATE_DIR"] == str(state)
    codex = tomllib.loads(_setup(report, "Codex").text)["mcp_servers"]["pkb"]
    assert codex["env"]["PKB_STATE_DIR"] == str(state) and codex["env"]["PATH"] == os.environ["PATH"]
    assert codex["tool_timeout_sec"] == 900
    gemini = json.loads(_setup(report, "Gemini CLI").text)["mcpServers"]["pkb"]
    assert (
        gemini["args"] == ["-m", "pkb_mcp", "serve"]
        and "GEMINI_CLI_TRUST_WORKSPACE" in _setup(report, "Gemini CLI").notes[0]
    )
    assert "@modelcontextprotocol/inspector@2.12.0" in _setup(report, "MCP Inspector").text


def test_an_unwritable_state_folder_fails_the_doctor_with_exit_1(tmp_path):
    (tmp_path / "file").write_text("")
    env = dict(os.environ, PKB_STATE_DIR=str(tmp_path / "file" / "state"))
    proc = subprocess.run(
        [sys.executable, "-m", "pkb_mcp", "doctor", "--json", "--no-sweep"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    found = {f["name"]: f for f in json.loads(proc.stdout)["findings"]}
    assert found["state"]["status"] == "fail" and "PKB_STATE_DIR" in found["state"]["detail"]


# ---------------------------------------------------------------- integration: Docker, real clients


@pytest.mark.integration
def test_the_doctor_removes_a_dead_server_s_sandboxes_and_keeps_a_live_one_s(state):
    from sandbox.docker import LABEL, OWNER_LABEL, connect
    from sandbox.image import ensure_image

    client = connect()
    image = ensure_image(client)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is gone: its server was killed before its cleanup
    made = {
        who: client.containers.create(
            image, ["true"], labels={LABEL: "1", OWNER_LABEL: f"{socket.gethostname()}:{pid}"}
        )
        for who, pid in (("dead", dead.pid), ("live", os.getpid()))
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pkb_mcp", "doctor", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        removed = json.loads(proc.stdout)["removed"]
        assert any("sandbox container" in r for r in removed), removed
        names = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
        assert made["dead"].id not in names and made["live"].id in names
    finally:
        for c in made.values():
            with contextlib.suppress(Exception):
                c.remove(force=True)


def _client(var: str) -> str:
    exe = os.environ.get(var)
    if not exe:
        pytest.skip(f"{var} is not set (.ci/run installs the clients)")
    return exe


@pytest.mark.integration
def test_claude_code_s_own_check_connects_to_pkb_as_the_doctor_set_it_up(state, tmp_path):
    exe = _client("PKB_CLAUDE")
    argv = shlex.split(_setup(doctor.examine(sweep=False), "Claude Code").text)
    env = dict(os.environ, CLAUDE_CONFIG_DIR=str(tmp_path / "claude"))
    added = subprocess.run([exe, *argv[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    listed = subprocess.run(
        [exe, "mcp", "list"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    line = next(line for line in listed.stdout.splitlines() if line.startswith("pkb"))
    assert "Connected" in line, listed.stdout + listed.stderr


@pytest.mark.integration
def test_gemini_cli_s_own_check_connects_to_pkb_as_the_doctor_set_it_up(state, tmp_path):
    exe = _client("PKB_GEMINI")
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(_setup(doctor.examine(sweep=False), "Gemini CLI").text)
    env = dict(os.environ, HOME=str(home), GEMINI_CLI_TRUST_WORKSPACE="true")
    listed = subprocess.run(
        [exe, "mcp", "list"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    out = listed.stdout + listed.stderr
    line = next((line for line in out.splitlines() if "pkb" in line), out)
    assert "Connected" in line and "Disconnected" not in line, out


@pytest.mark.integration
def test_codex_reads_the_doctor_s_set_up_with_pkb_s_environment(state, tmp_path):
    """Codex's `mcp list` checks no connection (its exec does: tests/test_agents_run.py); `mcp get`
    shows the configuration as Codex read it."""
    exe = _client("PKB_CODEX")
    (tmp_path / "config.toml").write_text(_setup(doctor.examine(sweep=False), "Codex").text + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEX_", "OPENAI_"))}
    env["CODEX_HOME"] = str(tmp_path)
    got = subprocess.run(
        [exe, "mcp", "get", "pkb", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    server = json.loads(got.stdout)
    transport = server.get("transport", server)
    assert transport["command"] == sys.executable and transport["env"]["PKB_STATE_DIR"] == str(state)


@pytest.mark.integration
def test_the_inspector_run_as_the_doctor_says_reports_no_portability_finding(state, tmp_path):
    inspector = _client("PKB_INSPECTOR")
    argv = shlex.split(_setup(doctor.examine(sweep=False), "MCP Inspector").text)
    assert argv[:3] == ["npx", "-y", "@modelcontextprotocol/inspector@2.12.0"]
    node = os.environ.get("PKB_NODE")  # Node 22 (.ci/run): what the Inspector declares
    cmd = [*([node] if node else []), inspector, *argv[3:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "warning" not in proc.stderr.lower() and "error" not in proc.stderr.lower(), proc.stderr[-2000:]
    assert len(json.loads(proc.stdout)["tools"]) == 10


@pytest.mark.integration
def test_codex_s_app_server_connects_to_pkb_as_the_doctor_set_it_up(state, tmp_path):
    """Codex's own check of an MCP server: its app-server's `mcpServerStatus/list` (JSON-RPC over
    stdio) starts pkb from the doctor's config.toml and lists its server info and tools."""
    exe = _client("PKB_CODEX")
    (tmp_path / "config.toml").write_text(_setup(doctor.examine(sweep=False), "Codex").text + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEX_", "OPENAI_"))}
    env["CODEX_HOME"] = str(tmp_path)
    hello = {"clientInfo": {"name": "pkb-test", "version": "0"}}
    calls = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "mcpServerStatus/list", "params": {}},
    ]
    server = subprocess.Popen(
        [exe, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        for call in calls:
            server.stdin.write(json.dumps(call) + "\n")
        server.stdin.flush()
        deadline = time.monotonic() + 180
        listed = None
        while listed is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, "the app-server ended before it answered"
            message = json.loads(line)
            listed = message if message.get("id") == 2 else None
    finally:
        server.kill()
        server.wait()
    assert listed is not None and "result" in listed, listed
    pkb = next(s for s in listed["result"]["data"] if s["name"] == "pkb")
    assert pkb["serverInfo"]["name"] == "pkb" and "run_correctness" in pkb["tools"], pkb.get("serverInfo")
