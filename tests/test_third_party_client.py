"""A client that is not ours, the MCP Inspector CLI (npm), against the real server over stdio.

.ci/run installs it and sets PKB_INSPECTOR; elsewhere the test is skipped unless PKB_INSPECTOR points
at an `mcp-inspector` binary (npm install @modelcontextprotocol/inspector).
"""

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT
from .test_mcp_snapshot import TOOLS

INSPECTOR = os.environ.get("PKB_INSPECTOR")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not INSPECTOR, reason="PKB_INSPECTOR is not set (.ci/run sets it)"),
]


def inspect(tmp_path, *args):
    env = dict(os.environ, PKB_STATE_DIR=str(tmp_path / "state"), PKB_LAUNCH_DIR=str(tmp_path))
    node = os.environ.get("PKB_NODE")  # Node 22 (.ci/run), which the Inspector declares
    cmd = [*([node] if node else []), INSPECTOR, "--cli", sys.executable, "-m", "pkb_mcp", "serve", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_inspector_lists_the_tools(tmp_path):
    names = [t["name"] for t in inspect(tmp_path, "--method", "tools/list")["tools"]]
    assert names == TOOLS, "every tool, in the server's own order"


def test_inspector_runs_run_correctness_on_cpu(tmp_path):
    out = inspect(
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "run_correctness",
        "--tool-arg",
        "problem=1",
        "--tool-arg",
        "path=problems/001_allreduce.py",
        "--tool-arg",
        "world_size=2",
        "--tool-arg",
        "trials=2",
        "--tool-arg",
        "device=cpu",
    )
    assert out["structuredContent"]["state"] == "done"
    assert out["structuredContent"]["result"]["verdict"] == "pass"
    assert "PASS" in out["content"][0]["text"]
