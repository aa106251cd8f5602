"""The agent's client in a container of its own (pkb_mcp/agents/container.py), each defence a check
that fails without it: it writes its workspace as the sandbox's user, reads its stdin, sees neither the
repository nor a host file outside its mounts nor the Docker socket, has the host's /usr (node), and is
ended with everything it started, nothing left."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pkb_mcp.agents import container

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _docker():
    if not container.available():
        pytest.skip("no Docker engine answers")


def test_the_client_sees_only_its_mounts_and_is_ended_with_what_it_started(tmp_path):
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("the server's token")
    script = (
        f"echo started; id -u; cat; cat {secret} || echo no-secret; ls {REPO} || echo no-repo; "
        "ls /var/run/docker.sock || echo no-socket; node --version; echo written > solution.py; "
        "setsid sleep 600 & sleep 600"
    )
    proc = container.launch(
        ["/usr/bin/bash", "-c", script],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=ws,
        mounts=[container.Mount(ws, str(ws), True), container.Mount(home, str(home), True)],
        stderr=tmp_path / "stderr.log",
        stdin=b"the task\n",
        name=f"pkb-agent-test-{tmp_path.name[-20:]}",
        labels={},
    )
    first = proc.stdout.readline()  # as it comes, before the client ends
    assert first == b"started\n" and proc.poll() is None
    deadline = time.monotonic() + 30
    while not (ws / "solution.py").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.kill_all()
    out = first.decode() + proc.stdout.read().decode()
    lines = out.split("\n")
    assert lines[1] == str(container.SANDBOX_UID) and lines[2] == "the task"
    assert "no-secret" in out and "no-repo" in out and "no-socket" in out and "the server's token" not in out
    assert any(line.startswith("v") for line in lines), out
    assert (ws / "solution.py").read_text() == "written\n"
    assert proc.leftovers() == []
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={container.LABEL}={proc.container.name}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert left.stdout.strip() == ""


def test_the_host_address_is_the_agents_network_gateway():
    address = container.host_address()
    assert address.count(".") == 3 and not address.startswith("127.")
