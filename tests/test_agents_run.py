"""`pkb agents run` (pkb_mcp/agents): its refusals, the clients' configuration files and transcript
readers (fast), and whole runs with a `cmd:` agent over pkb's real MCP server in the sandbox
(integration): one right and one wrong file, an agent that writes nothing, one that never connects
(`no_tools`), one that hangs (ended at --wall with everything it started), and a resumed run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from pkb_mcp.agents import clients, trail
from pkb_mcp.agents.records import AgentSettings, AttemptRecord
from pkb_mcp.agents.run import run_agents, select_problems
from pkb_mcp.errors import UserError

HERE = Path(__file__).resolve().parent
AGENT = HERE / "agents" / "mcp_agent.py"
TRANSCRIPTS = HERE / "agents" / "transcripts"
GOOD = """import torch.distributed as dist


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return out
"""
BAD = "def solution(x):\n    return x * 2\n"


# ---------------------------------------------------------------- fast


def test_problems_are_chosen_by_id_range_category_and_all():
    assert select_problems("1,3-4") == [1, 3, 4]
    assert select_problems("all")[:2] == [1, 2] and len(select_problems("all")) >= 80
    assert select_problems("4,1-2,2") == [4, 1, 2]
    with pytest.raises(UserError, match="names no problem"):
        select_problems("nothing-like-it")


def test_an_unknown_agent_or_a_missing_client_is_one_sentence(monkeypatch):
    with pytest.raises(UserError, match="none of claude, codex, gemini, cursor"):
        clients.client("aider")
    monkeypatch.setenv("PKB_CODEX", "/nonexistent/codex")
    with pytest.raises(UserError, match=r"\$PKB_CODEX .* is not an executable"):
        clients.executable(clients.client("codex"))
    with pytest.raises(UserError, match="cmd: needs a command"):
        clients.client("cmd:  ")


def test_bad_settings_are_refused_before_anything_starts(tmp_path):
    base = dict(agent="cmd:true", problems=[1], attempts=1, world_size=2, device="cpu", agent_sandbox="none")
    for change, said in (
        ({"attempts": 0}, "--attempts must be at least 1"),
        ({"wall_s": 0}, "--wall must be"),
        ({"world_size": 1}, "cannot run at world size 1"),
    ):
        with pytest.raises(UserError, match=said):
            run_agents(AgentSettings(**{**base, **change}), tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_a_resumed_run_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    settings = AgentSettings(agent="cmd:true", problems=[1], attempts=1, world_size=2, agent_sandbox="none")
    (out / "config.json").write_text(settings.model_copy(update={"model": "other"}).model_dump_json())
    with pytest.raises(UserError, match=r"other settings \(model\)"):
        run_agents(settings, out)


def _server(url: bool) -> clients.Server:
    if url:
        return clients.Server(url="http://172.17.0.1:9999/mcp", token="t0k")
    return clients.Server(
        command=sys.executable, args=("-m", "pkb_mcp", "serve"), env={"PKB_STATE_DIR": "/s"}
    )


@pytest.mark.parametrize("url", [False, True])
def test_each_client_gets_pkb_in_its_own_format(tmp_path, url):
    server = _server(url)
    ws = tmp_path / "ws"
    env = clients.CLIENTS["claude"].write_config(tmp_path / "claude", ws, server)
    claude = json.loads((tmp_path / "claude" / "pkb-mcp.json").read_text())["mcpServers"]["pkb"]
    assert (
        env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "claude") and env["MCP_CONNECTION_NONBLOCKING"] == "false"
    )
    assert env["ENABLE_TOOL_SEARCH"] == "false"
    env = clients.CLIENTS["codex"].write_config(tmp_path / "codex", ws, server)
    codex = tomllib.loads((tmp_path / "codex" / "config.toml").read_text())["mcp_servers"]["pkb"]
    clients.CLIENTS["gemini"].write_config(tmp_path / "gemini", ws, server)
    gemini = json.loads((tmp_path / "gemini" / ".gemini" / "settings.json").read_text())["mcpServers"]["pkb"]
    trusted = json.loads((tmp_path / "gemini" / ".gemini" / "trustedFolders.json").read_text())
    assert trusted == {str(ws): "TRUST_FOLDER"}
    if url:
        assert claude == {"type": "http", "url": server.url, "headers": {"Authorization": "Bearer t0k"}}
        assert codex["url"] == server.url and codex["http_headers"] == {"Authorization": "Bearer t0k"}
        assert gemini["httpUrl"] == server.url
    else:
        assert claude["command"] == sys.executable and claude["env"] == {"PKB_STATE_DIR": "/s"}
        assert codex["command"] == sys.executable and codex["env"] == {"PKB_STATE_DIR": "/s"}
        assert gemini["args"] == ["-m", "pkb_mcp", "serve"]


def test_a_provider_chosen_in_the_environment_reaches_the_clients_fresh_home(tmp_path, monkeypatch):
    """A fresh home has no provider settings of the user's: Codex is given OPENAI_BASE_URL as its
    `openai_base_url`, Gemini CLI API-key auth when GEMINI_API_KEY is set (else 0.61 picks a
    "gateway" auth for a base URL and refuses it headless)."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    clients.CLIENTS["codex"].write_config(tmp_path / "codex", tmp_path, _server(False))
    assert tomllib.loads((tmp_path / "codex" / "config.toml").read_text())["openai_base_url"] == (
        "http://127.0.0.1:9/v1"
    )
    clients.CLIENTS["gemini"].write_config(tmp_path / "gemini", tmp_path, _server(False))
    settings = json.loads((tmp_path / "gemini" / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("GEMINI_API_KEY")
    clients.CLIENTS["codex"].write_config(tmp_path / "codex2", tmp_path, _server(False))
    assert "openai_base_url" not in tomllib.loads((tmp_path / "codex2" / "config.toml").read_text())


def test_a_client_without_a_key_in_the_environment_is_warned_of_before_the_run():
    claude = clients.CLIENTS["claude"]
    assert claude.signed_in({"CLAUDE_CODE_OAUTH_TOKEN": "t"}) is None
    warning = claude.signed_in({})
    assert warning and "ANTHROPIC_API_KEY" in warning and "own login is not carried" in warning
    assert clients.cmd_client("true").signed_in({}) is None  # a cmd: agent's sign-in is its own


@pytest.mark.parametrize(
    "name, pkb",
    [("mcp__pkb__run_correctness", True), ("mcp_pkb_benchmark", True), ("run_correctness", True),
     ("mcp__other__run_correctness", False), ("mcp_pkb_nothing", False), ("Write", False)],
)  # fmt: skip
def test_pkb_tools_are_told_by_each_clients_naming(name, pkb):
    assert clients.is_pkb_tool(name) is pkb


def test_budgets_go_where_the_client_has_them_and_are_noted_where_not(tmp_path):
    home = tmp_path / "h"
    clients.CLIENTS["claude"].write_config(home, tmp_path, _server(False))
    launch = clients.CLIENTS["claude"].launch("claude", home, "m", "TASK", 7, 1.5)
    assert launch.stdin == b"TASK" and "--max-turns" in launch.argv and "--max-budget-usd" in launch.argv
    assert launch.argv[launch.argv.index("--mcp-config") + 1] == str(home / "pkb-mcp.json")
    codex = clients.CLIENTS["codex"].launch("codex", home, "m", "TASK", 7, None)
    assert codex.argv[-2:] == ["--", "TASK"] and codex.stdin is None
    assert any("no turn limit" in n for n in codex.notes)


def _lines(events: list[dict]) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def test_claude_code_transcripts_give_preflight_usage_and_tool_calls():
    init = {"type": "system", "subtype": "init", "claude_code_version": "2.1.332", "model": "claude-x",
            "mcp_servers": [{"name": "pkb", "status": "connected"}],
            "tools": ["Bash", "Write", "mcp__pkb__run_correctness", "mcp__pkb__benchmark"]}  # fmt: skip
    use = {"type": "assistant", "message": {"content": [
        {"type": "tool_use", "name": "Write", "input": {}},
        {"type": "tool_use", "name": "mcp__pkb__run_correctness", "input": {}}]}}  # fmt: skip
    result = {"type": "result", "subtype": "success", "num_turns": 3, "total_cost_usd": 0.25,
              "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2,
                        "output_tokens": 7}}  # fmt: skip
    t = clients.CLIENTS["claude"].read([*_lines([init, use, result]), b"not json"])
    assert t.preflight and t.preflight_tools == ["run_correctness", "benchmark"] and t.version == "2.1.332"
    assert (t.usage.tool_calls, t.usage.pkb_calls, t.tool_lines) == (2, 1, [1, 1])
    assert (t.usage.turns, t.usage.input_tokens, t.usage.cached_tokens, t.usage.output_tokens) == (
        3,
        17,
        5,
        7,
    )
    assert t.usage.cost_usd == 0.25
    failed = {**init, "mcp_servers": [{"name": "pkb", "status": "failed"}], "tools": ["Bash"]}
    t = clients.CLIENTS["claude"].read(_lines([failed]))
    assert t.preflight is False and "pkb failed" in t.preflight_message


def test_codex_transcripts_give_usage_and_tool_calls():
    events = [
        {"type": "thread.started", "thread_id": "x"},
        {"type": "item.started", "item": {"type": "command_execution", "command": "ls"}},
        {"type": "item.completed", "item": {"type": "file_change"}},
        {
            "type": "item.started",
            "item": {"type": "mcp_tool_call", "server": "pkb", "tool": "run_correctness"},
        },
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 9},
        },
    ]
    t = clients.CLIENTS["codex"].read(_lines(events))
    assert (t.usage.tool_calls, t.usage.pkb_calls, t.tool_lines) == (3, 1, [1, 2, 3])
    assert (t.usage.turns, t.usage.input_tokens, t.usage.cached_tokens, t.usage.output_tokens) == (
        1,
        100,
        40,
        9,
    )
    assert t.preflight is None  # Codex does not report its tools: pkb's server's mark decides


@pytest.mark.parametrize("path", sorted(TRANSCRIPTS.glob("*.jsonl")) if TRANSCRIPTS.is_dir() else [])
def test_recorded_transcripts_of_the_real_clients_are_read(path):
    """Transcripts the real clients wrote (tests/agents/README.md): each is read without error, and
    what it shows is what its name says."""
    name = path.stem.split("-")[0]
    t = clients.CLIENTS[name].read(path.read_bytes().splitlines())
    if "pass" in path.stem:
        assert t.usage.pkb_calls >= 1 and t.usage.tool_calls >= 2
        if name == "claude":
            assert t.preflight and "run_correctness" in t.preflight_tools
    if name == "claude" and "mcp-failed" in path.stem:
        assert t.preflight is False


# ---------------------------------------------------------------- integration: whole runs


def _cmd(*args: str) -> str:
    return "cmd:" + " ".join(shlex.quote(a) for a in [sys.executable, str(AGENT), *args])


@pytest.fixture
def sources(tmp_path):
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    return tmp_path


@pytest.mark.integration
def test_a_run_of_two_problems_and_two_attempts_is_recorded_judged_and_resumed(sources, monkeypatch):
    # the agent's behaviour by problem and attempt: right, wrong / no file, never connected
    script = (
        f'case "$PKB_PROBLEM-$PKB_ATTEMPT" in '
        f"1-0) exec {sys.executable} {AGENT} {sources / 'good.py'};; "
        f"1-1) exec {sys.executable} {AGENT} {sources / 'bad.py'};; "
        f"2-0) exec {sys.executable} {AGENT} --no-file;; "
        f"*) exec {sys.executable} {AGENT} --no-mcp {sources / 'bad.py'};; esac"
    )
    settings = AgentSettings(
        agent="cmd:" + script, problems=[1, 2], attempts=2, world_size=2, device="cpu",
        agent_sandbox="none", wall_s=240,
    )  # fmt: skip
    out = sources / "run"
    run = run_agents(settings, out)
    records = {
        (r.problem_id, r.attempt): r
        for r in (
            AttemptRecord.model_validate_json(p.read_text()) for p in out.glob("*/attempt-*/attempt.json")
        )
    }
    assert {k: r.status for k, r in records.items()} == {
        (1, 0): "done", (1, 1): "done", (2, 0): "no_file", (2, 1): "no_tools",
    }  # fmt: skip
    good = records[(1, 0)]
    assert good.preflight.ok and "run_correctness" in good.preflight.tools
    assert [(s.kind, s.passed) for s in good.snapshots] == [("check", True)]
    assert (out / "001_allreduce" / "attempt-0" / good.snapshots[0].file).read_text() == GOOD
    assert [(s.kind, s.passed) for s in records[(1, 1)].snapshots] == [("check", False)]
    assert all(not r.leftovers for r in records.values())
    # judged by pkb eval: the right file correct, the wrong one not; the no_tools one counted apart
    by_problem = {p.problem_id: p for p in run.scores.problems}
    assert (by_problem[1].attempts, by_problem[1].correct) == (2, 1)
    assert by_problem[2].correct == 0 and run.scores.no_tools == 1
    assert run.pass_at_k["1"] == pytest.approx(0.25)  # problem 1: 1 of 2; problem 2: 0 of 1 counted
    harbor = json.loads((out / "001_allreduce" / "attempt-0" / "result.json").read_text())
    assert harbor["verifier_result"]["rewards"]["reward"] == 1.0 and harbor["agent_info"]["name"] == "cmd"
    assert (
        json.loads((out / "002_allgather" / "attempt-1" / "result.json").read_text())["exception_info"][
            "exception_type"
        ]
        == "no_tools"
    )
    assert (out / "report" / "report.md").exists() and (out / "agents.md").exists()
    assert json.loads((out / "result.json").read_text())["pass_at_k"]["1"] == pytest.approx(0.25)
    # resumed: nothing runs again
    again = run_agents(settings, out)
    assert (again.attempts_run, again.attempts_resumed) == (0, 4)


@pytest.mark.integration
def test_an_agent_that_hangs_is_ended_at_the_wall_with_everything_it_started(sources):
    settings = AgentSettings(
        agent=_cmd("--hang"),
        problems=[1],
        attempts=1,
        world_size=2,
        device="cpu",
        agent_sandbox="none",
        wall_s=6,
    )
    t0 = time.monotonic()
    run = run_agents(settings, sources / "run", judge=False)
    record = AttemptRecord.model_validate_json(
        (sources / "run" / "001_allreduce" / "attempt-0" / "attempt.json").read_text()
    )
    assert record.status == "agent_timeout" and record.leftovers == []
    assert time.monotonic() - t0 < 60 and run.scores.causes.get("agent_timeout") == 1
    # the `setsid sleep 600` it started left its group: found by the attempt's mark, and ended
    alive = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    assert not [p for p in alive if _marked(p)], alive


@pytest.mark.integration
@pytest.mark.skipif(
    not os.environ.get("PKB_CLAUDE"), reason="PKB_CLAUDE names no Claude Code (.ci/run installs it)"
)
@pytest.mark.parametrize("where", ["none", "docker"])
def test_the_real_claude_code_without_a_key_passes_the_preflight_and_fails_as_the_client(
    tmp_path, monkeypatch, where
):
    """Claude Code from npm, no key: its init event lists pkb's server connected and its tools (the
    preflight, before any model call), then it ends "Not logged in": agent_error, not no_tools. In its
    own container (the default) it reaches the attempt's pkb server on the host over HTTP."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = AgentSettings(
        agent="claude", problems=[1], attempts=1, world_size=2, device="cpu", agent_sandbox=where, wall_s=120
    )
    run = run_agents(settings, tmp_path / "run", judge=False)
    record = AttemptRecord.model_validate_json(
        (tmp_path / "run" / "001_allreduce" / "attempt-0" / "attempt.json").read_text()
    )
    assert record.preflight.ok and "run_correctness" in record.preflight.tools, record.preflight
    assert record.status == "agent_error" and "Not logged in" in record.message
    assert record.agent_version == "2.1.332" and record.leftovers == [] and record.agent_sandbox == where
    assert run.scores.causes == {"agent_error": 1}
    if where == "docker":
        assert (
            "serving MCP on http://"
            in (tmp_path / "run" / "001_allreduce" / "attempt-0" / "server.log").read_text()
        )


@pytest.mark.integration
@pytest.mark.skipif(
    not os.environ.get("PKB_CLAUDE"), reason="PKB_CLAUDE names no Claude Code (.ci/run installs it)"
)
def test_the_real_claude_code_whose_pkb_server_cannot_start_is_no_tools(tmp_path, monkeypatch):
    """A broken pkb install on the server's PYTHONPATH: Claude Code's init event says pkb failed, so
    the attempt is no_tools (counted apart, not the model's failure), whatever the client did next."""
    broken = tmp_path / "broken" / "pkb_mcp"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a broken pkb install')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = AgentSettings(
        agent="claude", problems=[1], attempts=1, world_size=2, device="cpu", agent_sandbox="none", wall_s=120
    )
    run = run_agents(settings, tmp_path / "run", judge=False)
    record = AttemptRecord.model_validate_json(
        (tmp_path / "run" / "001_allreduce" / "attempt-0" / "attempt.json").read_text()
    )
    assert record.status == "no_tools" and not record.preflight.ok, record
    assert "pkb" in record.preflight.message and "failed" in record.preflight.message
    assert run.scores.no_tools == 1 and run.scores.causes == {"no_tools": 1}


# each real client against its model's stand-in: the variables that point it there, its model, its version
REAL_CLIENTS = {
    "claude": ("AnthropicStandIn", {"ANTHROPIC_BASE_URL": "", "ANTHROPIC_API_KEY": "test"},
               "claude-sonnet-4-5", "2.1.332"),
    "codex": ("ResponsesStandIn", {"OPENAI_BASE_URL": "/v1", "OPENAI_API_KEY": "test"},
              "gpt-5.5", "codex-cli 0.171.0"),
    "gemini": ("GeminiStandIn", {"GOOGLE_GEMINI_BASE_URL": "", "GEMINI_API_KEY": "test"},
               "gemini-2.5-pro", "0.61.0"),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("agent", list(REAL_CLIENTS))
def test_a_real_client_scripted_right_and_wrong_is_recorded_judged_and_tabled(tmp_path, monkeypatch, agent):
    """The real client (npm, pinned) calls pkb's real MCP server; only the model is a loopback
    stand-in (tests/agents/standin.py), whose turns read the problem, write solution.py with the
    client's own file tool, call run_correctness on it and end. Attempt 0 of problem 1 is right, the
    rest wrong. Claude Code over 2 problems x 2 attempts (the second problem's file in the wrong
    shape), the others over problem 1 x 2 attempts, to keep CI short."""
    from tests.agents import standin

    exe = os.environ.get(clients.CLIENTS[agent].env_var)
    if not exe:
        pytest.skip(f"{clients.CLIENTS[agent].env_var} names no {agent} (.ci/run installs it)")
    kind, variables, model, version = REAL_CLIENTS[agent]
    problems = [1, 2] if agent == "claude" else [1]
    script = standin.attempt_script(
        problem=lambda s: "2" if "/002_allgather/" in (s.cwd or "") else "1",
        source=lambda s: GOOD if "/001_allreduce/attempt-0/" in (s.cwd or "") else BAD,
        trials=1,
    )
    settings = AgentSettings(
        agent=agent, model=model, problems=problems, attempts=2, world_size=2, device="cpu",
        agent_sandbox="none", wall_s=240,
    )  # fmt: skip
    for name in [
        k for k in os.environ if k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "GEMINI_", "GOOGLE_"))
    ]:
        monkeypatch.delenv(name)
    with getattr(standin, kind)(script) as api:
        for name, value in variables.items():
            monkeypatch.setenv(name, api.url + value if "BASE_URL" in name else value)
        run = run_agents(settings, tmp_path / "run")
    assert api.errors == []
    out = tmp_path / "run"
    records = {
        (r.problem_id, r.attempt): r
        for r in (
            AttemptRecord.model_validate_json(p.read_text()) for p in out.glob("*/attempt-*/attempt.json")
        )
    }
    assert len(records) == 2 * len(problems)
    for r in records.values():
        assert r.status == "done" and r.preflight.ok and "run_correctness" in r.preflight.tools, r
        assert r.agent_version == version and not r.leftovers, r
        assert r.usage.pkb_calls == 2 and r.usage.tool_calls >= 3 and r.usage.input_tokens, r.usage
        assert [s.kind for s in r.snapshots] == ["check"] and r.snapshots[0].step >= 3, r.snapshots
    assert [s.passed for s in records[(1, 0)].snapshots] == [True]
    assert [s.passed for s in records[(1, 1)].snapshots] == [False]
    transcript = (out / "001_allreduce" / "attempt-0" / "transcript.jsonl").read_text()
    assert "run_correctness" in transcript and "pass" in transcript
    if agent == "claude":
        assert all((r.usage.turns, r.usage.tool_calls) == (4, 3) for r in records.values())
        assert all(r.usage.cost_usd is not None for r in records.values())
        assert run.scores.causes == {"correct": 1, "mismatch": 1, "shape": 2}
        assert run.pass_at_k == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
        steps = {p.steps: p.correct for p in run.scores.steps}
        assert steps[2] == 0 and steps[3] == pytest.approx(0.25)  # correct once run_correctness said so
    else:
        assert run.scores.causes == {"correct": 1, "mismatch": 1}
        assert run.pass_at_k == {"1": pytest.approx(0.5), "2": pytest.approx(1.0)}
    assert (out / "report" / "report.md").exists() and (out / "steps.png").exists()
    harbor = json.loads((out / "001_allreduce" / "attempt-0" / "result.json").read_text())
    assert harbor["agent_info"]["name"] == agent and harbor["verifier_result"]["rewards"]["reward"] == 1.0


def _marked(pid: str) -> bool:
    try:
        return b"PKB_AGENT_ATTEMPT=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_the_cli_refuses_a_bad_agent_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pkb_mcp", "agents", "run", "--agent", "aider", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, env={**os.environ}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "none of claude" in out.stderr


def test_an_attempts_files_are_read_without_trusting_them(tmp_path):
    """A client running as the user can replace the attempt's record, trail or snapshots' sources: a
    FIFO there (which would hang a plain read) and a link out of the folder are refused."""
    from pkb_mcp.agents import attempt

    secret = tmp_path / "secret"
    secret.write_text('{"tools": ["stolen"]}')
    folder = tmp_path / "attempt"
    folder.mkdir()
    os.mkfifo(folder / "attempt.json")
    (folder / "listed.json").symlink_to(secret)
    assert attempt.read_record(folder) is None
    assert trail.listed(folder / "listed.json") is None
    assert trail.read(folder, "attempt.json") is None


@pytest.mark.parametrize(
    "result, expected",
    [({"verdict": "pass", "speedup": 1.4, "within_noise": False}, (True, 1.4)),
     ({"verdict": "pass", "speedup": 1.4, "within_noise": True}, (True, None)),
     ({"verdict": "suspect", "speedup": 9.0}, (True, None)), ({"verdict": "fail"}, (False, None))],
)  # fmt: skip
def test_a_snapshot_s_bench_speedup_is_credited_as_pkb_credits_it(result, expected):
    """A bench within noise passed but credited nothing: the steps curve's "fast" must not count it."""
    assert trail._outcome("bench", result) == expected
