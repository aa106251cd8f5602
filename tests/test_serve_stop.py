"""`pkb serve` stopped by its client, every way a client stops it, in the Docker sandbox on CPU: the
server's warm sandboxes are started, then the client closes its stdin, sends SIGINT, SIGTERM, SIGINT
and SIGTERM 100 ms apart (what Claude Code does at the end of every headless run), SIGHUP, or is
killed. Within END_S nothing of the server is left: no container of its owner label, no launch
directory, no process. A second server on the same engine keeps its sandboxes throughout."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sandbox.docker import OWNER_LABEL

from .conftest import ROOT, docker_client, launch_processes, wait_for

CLIENT = docker_client()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("small_docker_limits"),
    pytest.mark.skipif(CLIENT is None, reason="no Docker engine answers"),
]

END_S = 30.0  # the bound the server keeps (pkb_mcp/frontends/cli.py SERVE_END_S)
CLIENT_SCRIPT = (
    "import subprocess, sys, time\n"
    "server = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE)\n"
    "print(server.pid, flush=True)\n"
    "time.sleep(3600)\n"
)


def owned(pid: int) -> list:
    label = f"{OWNER_LABEL}={os.uname().nodename}:{pid}"
    return CLIENT.containers.list(all=True, filters={"label": label})


def serve(tmp_path, name: str, via_client: bool = False) -> tuple[subprocess.Popen, int]:
    """A `pkb serve` over stdio with its own state folder (and the test's launch folder), its stdin a
    pipe of ours, or of a client process when `via_client`; (the process we hold, the server's pid)."""
    env = {**os.environ, "PKB_STATE_DIR": str(tmp_path / name)}
    command = [sys.executable, "-m", "pkb_mcp", "serve"]
    if via_client:
        holder = subprocess.Popen(
            [sys.executable, "-c", CLIENT_SCRIPT, *command], env=env, cwd=ROOT, stdout=subprocess.PIPE
        )
        assert holder.stdout is not None
        pid = int(holder.stdout.readline())
        return holder, pid
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    return proc, proc.pid


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet waited for


def stop(proc: subprocess.Popen, pid: int, how: str) -> None:
    if how == "stdin closed":
        assert proc.stdin is not None
        proc.stdin.close()
    elif how == "client killed":
        proc.kill()  # the client dies; the server's stdin ends with it
    elif how == "SIGINT then SIGTERM 100 ms later":
        os.kill(pid, signal.SIGINT)
        time.sleep(0.1)
        os.kill(pid, signal.SIGTERM)
    else:
        os.kill(pid, getattr(signal, how))


# SIGKILL: what Codex 0.171 sends its MCP server 18 ms after SIGTERM; only the server's watcher
# (sandbox/reaper.py) can remove its sandboxes then, and its launch directories stay for the next sweep
WAYS = [
    "stdin closed",
    "SIGINT",
    "SIGTERM",
    "SIGINT then SIGTERM 100 ms later",
    "SIGHUP",
    "client killed",
    "SIGKILL",
]


@pytest.mark.parametrize("how", WAYS)
def test_a_stopped_server_leaves_nothing_and_another_keeps_its_sandboxes(how, tmp_path, isolated_dirs):
    proc, pid = serve(tmp_path, "stopped", via_client=how == "client killed")
    other, other_pid = serve(tmp_path, "other") if how == "SIGTERM" else (None, 0)
    try:
        wait_for(lambda: owned(pid), 180, "the server's warm sandbox")
        if other is not None:
            wait_for(lambda: owned(other_pid), 180, "the second server's warm sandbox")
        t0 = time.monotonic()
        stop(proc, pid, how)
        wait_for(lambda: gone(pid), END_S + 5, "the server's exit")
        assert time.monotonic() - t0 < END_S
        if how == "SIGKILL":  # the watcher removes them after the server is gone
            wait_for(
                lambda: owned(pid) == [], END_S, "the watcher's removal of the killed server's sandboxes"
            )
        assert owned(pid) == [], "no container of the stopped server may be left"
        assert [p for p in launch_processes(isolated_dirs)] == [] or other is not None
        assert other is None or [c.status for c in owned(other_pid)] == ["running"], "the other's stays"
        if other is None and how != "SIGKILL":
            assert list(isolated_dirs.iterdir()) == [], "no launch directory may be left"
    finally:
        for p in (proc, other):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if other is not None:
            wait_for(lambda: gone(other_pid), END_S + 5, "the second server's exit")
            for c in owned(other_pid):
                c.remove(force=True)
