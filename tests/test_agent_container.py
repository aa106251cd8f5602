"""The agent's client in a container of its own (pkb_mcp/agents/container.py): each defence a test that
fails without it. Skipped where no Docker engine answers, unless PKB_REQUIRE_DOCKER=1 (CI), where that
is an error."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pkb_mcp.agents import container
from pkb_mcp.agents.container import Mount

from .conftest import ROOT, docker_client

CLIENT = docker_client()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CLIENT is None, reason="no Docker engine answers"),
]
WAIT_S = 30


@pytest.fixture
def start(tmp_path):
    """Launch a command with the attempt's two writable mounts (workspace, home) at their host paths;
    every container started is ended at the test's end, and none may be left."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    started: list[container.ContainerProcess] = []

    def launch(argv, *, stdin=None, mounts=(), env=None, **kw):
        proc = container.launch(
            argv,
            env={"HOME": str(home), **(env or {})},
            cwd=ws,
            mounts=[Mount(ws, str(ws), writable=True), Mount(home, str(home), writable=True), *mounts],
            stderr=tmp_path / "stderr.log",
            stdin=stdin,
            name=f"pkb-agent-test-{secrets.token_hex(4)}",
            labels={"pkb.test": "1"},
            **kw,
        )
        started.append(proc)
        return proc

    launch.ws, launch.home, launch.stderr = ws, home, tmp_path / "stderr.log"  # type: ignore[attr-defined]
    yield launch
    for proc in started:
        proc.kill_all()
        assert proc.leftovers() == []
        assert containers(proc.name) == []


def containers(name: str) -> list:
    assert CLIENT is not None
    return CLIENT.containers.list(all=True, filters={"label": f"{container.LABEL}={name}"})


def bash(start, script: str, **kw) -> tuple[int, str]:
    """Run a shell script to its end: (exit status, stdout)."""
    proc = start(["bash", "-c", script], **kw)
    code = proc.wait(WAIT_S)
    return code, proc.stdout.read().decode()


def test_the_workspace_is_written_as_the_agent_user_and_the_host_sees_it(start):
    code, out = bash(start, "id -u; echo from-the-agent > solution.py")
    uid = container.agent_user()[0]
    assert code == 0, start.stderr.read_text()
    assert out.split() == [str(uid)] and uid != 0
    written = start.ws / "solution.py"
    assert written.read_text() == "from-the-agent\n"
    assert written.stat().st_uid == uid


def test_it_runs_without_root_capabilities_or_new_privileges(start):
    code, out = bash(start, "grep -E '^(Uid|Gid|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status")
    assert code == 0
    status = {line.split(":")[0]: line.split(":", 1)[1].split() for line in out.splitlines()}
    assert "0" not in status["Uid"] and "0" not in status["Gid"]
    for cap in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap][0], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"] == ["1"]


def test_nothing_of_the_host_is_visible_but_its_mounts(start, tmp_path):
    from pkb_mcp import config

    beside = tmp_path / "secret"  # next to the mounts, not in one
    in_repo = ROOT / f".pkb-agent-secret-{secrets.token_hex(4)}"
    in_tmp = Path("/tmp") / f"pkb-agent-secret-{secrets.token_hex(4)}"
    paths = [beside, in_repo, in_tmp]
    try:
        for p in paths:
            p.write_text("the server's token")
        probes = [*paths, ROOT / "pyproject.toml", "/root", "/home/root", config.cache_dir()]
        probes += ["/var/run/docker.sock", "/run/docker.sock", "/var/lib/docker", "/etc/shadow"]
        script = "".join(f"test -e {p} && echo SEEN {p}; " for p in probes) + "ls -A /tmp; true"
        code, out = bash(start, script)
    finally:
        for p in paths:
            p.unlink()
    assert code == 0
    assert "SEEN" not in out, out
    # /tmp holds only the way down to the mounts (they sit at their host paths, under the host's /tmp)
    expected = [start.ws.parts[2]] if start.ws.parts[1] == "tmp" else []
    assert out.split() == expected


def test_the_docker_socket_is_never_mounted(start, tmp_path):
    _, out = bash(start, "test -S /var/run/docker.sock || test -S /run/docker.sock || echo no-socket")
    assert out == "no-socket\n"
    socket_dir = Path(os.path.realpath("/var/run/docker.sock")).parent
    with pytest.raises(ValueError, match="Docker socket"):
        start(["true"], mounts=[Mount(socket_dir, "/hostrun")])


def test_mounts_over_its_own_folders_and_an_unwritable_home_are_refused(start, tmp_path):
    with pytest.raises(ValueError, match="container's own"):
        start(["true"], mounts=[Mount(tmp_path, "/usr/local/x")])
    with pytest.raises(ValueError, match="absolute"):
        start(["true"], mounts=[Mount(tmp_path, "relative")])
    with pytest.raises(ValueError, match="HOME"):
        start(["true"], env={"HOME": "/nonexistent"})


def test_its_root_is_read_only_but_tmp_and_home_are_writable(start):
    script = (
        "for p in /etc/x /usr/x /x /sbin/x; do touch $p 2>/dev/null && echo WROTE $p; done; "
        'touch /tmp/ok && echo tmp-ok; touch "$HOME/ok" && echo home-ok; '
        "awk '$5 == \"/\" {print $6}' /proc/self/mountinfo"
    )
    _, out = bash(start, script)
    lines = out.split("\n")
    assert lines[:2] == ["tmp-ok", "home-ok"], out
    assert lines[2].split(",")[0] == "ro"  # the root itself, not only its folders' owners, refuses writes
    assert (start.home / "ok").exists()


def test_kill_all_ends_everything_it_started_and_removes_the_container(start):
    # bash ignores SIGTERM (so the grace passes and SIGKILL follows), its child leaves its session
    proc = start(
        ["bash", "-c", "trap '' TERM; setsid sleep 987654 & echo started; while :; do sleep 1; done"]
    )
    assert proc.stdout.readline() == b"started\n"
    assert proc.poll() is None and proc.leftovers() != []
    deadline = time.monotonic() + 10  # "started" may come before the background child's exec of sleep
    while not _host_sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_sleepers() != [], "the probe must see the container's processes on the host"
    proc.kill_all()
    assert proc.leftovers() == []
    assert containers(proc.name) == []
    assert _host_sleepers() == []
    assert proc.poll() is not None
    proc.kill_all()  # idempotent
    assert proc.stdout.read() == b""


def test_kill_all_ends_a_client_whose_output_nobody_reads(start):
    proc = start(["yes"])
    assert proc.stdout.read(10) == b"y\ny\ny\ny\ny\n"  # it runs; then its output fills every buffer
    t0 = time.monotonic()
    proc.kill_all()
    assert time.monotonic() - t0 < 10
    assert proc.leftovers() == [] and containers(proc.name) == []


def _host_sleepers() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == b"sleep\x00987654\x00":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_stdout_comes_as_it_is_written(start):
    proc = start(["bash", "-c", "echo first; sleep 60; echo second"])
    assert proc.stdout.readline() == b"first\n"
    assert proc.poll() is None  # the line came before the client ended


def test_a_large_output_arrives_whole(start):
    proc = start(["bash", "-c", "head -c 3000000 /dev/zero | base64 -w 100; echo END"])
    out = proc.stdout.read()  # far more than the pipe holds: the client waits for its reader, loses nothing
    assert proc.wait(WAIT_S) == 0
    assert len(out) == 4_000_000 // 100 * 101 + 4 and out.endswith(b"END\n")


def test_stdin_is_delivered_and_then_closed(start):
    code, out = bash(start, "cat; echo END", stdin=b"line one\nline two\n")
    assert (code, out) == (0, "line one\nline two\nEND\n")


def test_without_stdin_it_reads_nothing_and_its_stderr_goes_to_its_file(start):
    code, out = bash(start, "cat; echo END; echo to-stderr >&2")
    assert (code, out) == (0, "END\n")
    assert start.stderr.read_text() == "to-stderr\n"


def test_it_reaches_a_server_on_the_host_address(start):
    address = container.host_address()
    with socket.socket() as server:
        server.bind((address, 0))
        server.listen()
        server.settimeout(WAIT_S)
        got: list[bytes] = []

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                got.append(conn.recv(100))
                conn.sendall(b"welcome")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        port = server.getsockname()[1]
        code = (
            f"import socket; s = socket.create_connection(({address!r}, {port}), timeout=10); "
            "s.sendall(b'token'); print(s.recv(100).decode())"
        )
        proc = start(["python3", "-c", code])
        assert proc.wait(WAIT_S) == 0, start.stderr.read_text()
        thread.join(WAIT_S)
    assert got == [b"token"]
    assert proc.stdout.read() == b"welcome\n"


def test_attempts_do_not_reach_each_other(start):
    listen = (
        "import socket; s = socket.socket(); s.bind(('0.0.0.0', 8765)); s.listen(); print('up', flush=True); "
    )
    listen += "[s.accept()[0].sendall(b'hello') for _ in range(9)]"
    first = start(["python3", "-c", listen])
    assert first.stdout.readline() == b"up\n"
    first.container.reload()
    ip = first.container.attrs["NetworkSettings"]["Networks"][container.NETWORK]["IPAddress"]
    with socket.create_connection((ip, 8765), timeout=10) as s:  # the host reaches it: the listener is up
        assert s.recv(5) == b"hello"
    probe = (
        f"import socket\ntry:\n socket.create_connection(({ip!r}, 8765), timeout=2).recv(5)\n"
        " print('REACHED')\nexcept OSError:\n print('blocked')"
    )
    second = start(["python3", "-c", probe])
    assert second.wait(WAIT_S) == 0
    assert second.stdout.read() == b"blocked\n"


def test_the_hosts_usr_gives_it_node_bash_git_python_and_the_ca_bundle(start):
    script = (
        "node --version; bash -c 'echo nested'; git --version; "
        "python3 -c \"import ssl; print(ssl.create_default_context().cert_store_stats()['x509_ca'])\"; "
        "grep '^nameserver' /etc/resolv.conf"
    )
    code, out = bash(start, script)
    assert code == 0, start.stderr.read_text()
    node, nested, git, cas, dns = out.splitlines()
    assert node.startswith("v") and nested == "nested" and git.startswith("git version")
    assert int(cas) > 0
    assert dns == "nameserver 127.0.0.11"  # the engine's resolver on pkb's network


def test_a_fork_bomb_stops_at_the_pids_limit(start):
    bomb = (
        "import os, time\nn = 0\nwhile n < 500:\n try:\n  pid = os.fork()\n except OSError:\n  break\n"
        " if pid == 0:\n  time.sleep(60)\n  os._exit(0)\n n += 1\nprint(n)"
    )
    proc = start(["python3", "-c", bomb], pids=32)
    assert proc.wait(WAIT_S) == 0, start.stderr.read_text()
    assert 0 < int(proc.stdout.read()) < 32


def test_memory_past_its_limit_ends_it(start):
    proc = start(["python3", "-c", "x = b'x' * (512 << 20); print('survived')"], memory=128 << 20)
    assert proc.wait(WAIT_S) == 137  # SIGKILL by the kernel's OOM killer
    proc.container.reload()
    assert proc.container.attrs["State"]["OOMKilled"] is True
    assert proc.stdout.read() == b""


def test_a_link_into_a_mounted_package_runs_the_real_file(start, tmp_path):
    package = tmp_path / "prefix" / "lib" / "node_modules" / "fake-client"
    package.mkdir(parents=True)
    (package / "package.json").write_text('{"name": "fake-client"}')
    cli = package / "cli.js"
    cli.write_text("#!/usr/bin/env node\nconsole.log(__dirname)\n")
    cli.chmod(0o755)
    link = tmp_path / "prefix" / "bin" / "fake-client"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(cli, link.parent))
    mounts = container.client_mounts(link)
    assert mounts == [Mount(package.parent, str(package.parent))]
    proc = start([str(link)], mounts=mounts)
    assert proc.wait(WAIT_S) == 0, start.stderr.read_text()
    assert proc.stdout.read().decode() == f"{package}\n"


def test_sweep_removes_only_containers_whose_pkb_process_is_gone():
    assert CLIENT is not None
    gone = subprocess.Popen(["true"])
    gone.wait()
    image = container.ensure_image(CLIENT, *container.agent_user())
    made = {}
    for who, owner in (("dead", f"{socket.gethostname()}:{gone.pid}"), ("mine", container.owner_id())):
        name = f"pkb-agent-sweep-{who}-{secrets.token_hex(4)}"
        CLIENT.containers.create(
            image, ["true"], name=name, labels={container.LABEL: name, container.OWNER_LABEL: owner}
        )
        made[who] = name
    try:
        removed = container.sweep()  # another pkb process's sweep may have taken the dead one first
        assert made["mine"] not in removed
        assert containers(made["dead"]) == [] and len(containers(made["mine"])) == 1
        assert made["mine"] in container.sweep(include_own=True)
        assert containers(made["mine"]) == []
    finally:
        for name in made.values():
            for c in containers(name):
                c.remove(force=True)
