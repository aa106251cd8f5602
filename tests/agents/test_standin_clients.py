"""The real Claude Code and Codex (npm, pinned) over pkb's real MCP server, their models stood in for.

Each test scripts one attempt (tests/agents/standin.py `attempt_script`): get_reference, write
solution.py into the working directory with the client's own file tool, run_correctness on it at
world size 2 on CPU, end. The client's stdout transcript must show those calls and pkb's verdict.
.ci/run installs the clients (tests/agents/install_clients.sh) and sets PKB_CLAUDE and PKB_CODEX;
elsewhere these tests are skipped unless those name the executables.
"""

from __future__ import annotations

import json
import os

import pytest

from . import drive
from .standin import AnthropicStandIn, ResponsesStandIn

pytestmark = pytest.mark.integration
CLAUDE = os.environ.get("PKB_CLAUDE")
CODEX = os.environ.get("PKB_CODEX")
WALL_S = 120.0  # one attempt takes 15-35 s on 2 cores; the limit only stops a hung client


def structured(text: str) -> dict:
    """pkb's structured content as the model got it: the JSON after whatever the client put first."""
    return json.loads(text[text.index("{") :])


@pytest.mark.skipif(not CLAUDE, reason="PKB_CLAUDE is not set (.ci/run sets it)")
def test_claude_code_attempt_through_pkb(tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    with AnthropicStandIn(drive.script(drive.CORRECT)) as model:
        run = drive.claude(CLAUDE, model, work, home, drive.task_text(1, 2), wall_s=WALL_S)
    assert run.rc == 0, run.stderr[-2000:]
    assert model.errors == []
    events = run.events()
    init = events[0]
    assert init["subtype"] == "init"
    assert [(m["name"], m["status"]) for m in init["mcp_servers"]] == [("pkb", "connected")]
    assert "mcp__pkb__run_correctness" in init["tools"]

    uses = [
        block
        for e in events
        if e["type"] == "assistant"
        for block in e["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert [u["name"] for u in uses] == ["mcp__pkb__get_reference", "Write", "mcp__pkb__run_correctness"]
    results = {
        block["tool_use_id"]: block
        for e in events
        if e["type"] == "user"
        for block in e["message"]["content"]
        if block.get("type") == "tool_result"
    }
    check = results[uses[2]["id"]]
    assert not check.get("is_error")
    assert structured(check["content"])["result"]["verdict"] == "pass"

    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False
    assert result["result"] == "run_correctness verdict: pass" and result["num_turns"] == 4
    assert result["permission_denials"] == [] and result["usage"]["input_tokens"] > 0
    assert (work / "solution.py").read_text() == drive.CORRECT
    assert len(model.posts("/v1/messages")) == 4  # with non-essential traffic off: one a turn


@pytest.mark.skipif(not CODEX, reason="PKB_CODEX is not set (.ci/run sets it)")
def test_codex_attempt_through_pkb(tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    with ResponsesStandIn(drive.script(drive.CORRECT)) as model:
        run = drive.codex(CODEX, model, work, home, drive.task_text(1, 2), wall_s=WALL_S)
    assert run.rc == 0, run.stderr[-2000:]
    assert model.errors == []
    done = [e["item"] for e in run.events() if e["type"] == "item.completed"]
    assert [i["type"] for i in done] == ["mcp_tool_call", "file_change", "mcp_tool_call", "agent_message"]
    reference, written, check, said = done
    assert (reference["server"], reference["tool"], reference["status"]) == (
        "pkb",
        "get_reference",
        "completed",
    )
    assert written["changes"] == [{"path": str(work / "solution.py"), "kind": "add"}]
    assert (check["tool"], check["status"]) == ("run_correctness", "completed")
    assert check["result"]["structured_content"]["result"]["verdict"] == "pass"
    assert said["text"] == "run_correctness verdict: pass"
    usage = [e for e in run.events() if e["type"] == "turn.completed"][-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert (work / "solution.py").read_text() == drive.CORRECT

    # the model's side: its MCP tools searched for first (gpt-5.5 defers them), then called in
    # pkb's namespace; the file written with apply_patch; each call's output back as text
    posts = model.posts("/v1/responses")
    assert len(posts) == 5
    kinds = [(getattr(a, "name", None), type(a).__name__) for _, a in model.actions]
    assert kinds[0] == ("tool_search", "Search") and kinds[2][0] == "apply_patch"
    last = posts[-1].body["input"]
    outputs = [i["output"] for i in last if i.get("type") == "function_call_output"]
    assert verdict_of(outputs[-1]) == "pass"


def verdict_of(output: str) -> str:
    """Codex hands a tool's output to the model as `Wall time: ...\\nOutput:\\n<pkb's JSON>`."""
    assert output.startswith("Wall time:")
    return structured(output)["result"]["verdict"]
