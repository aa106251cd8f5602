"""The process backend's fork server (harness/forkserver.py): one server for many launches, each rank a
fresh fork that sees only its launch's environment, nothing a rank leaves behind outlives its launch,
and launches still run where the server cannot start."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness import forking, forkserver
from pkb_mcp import problems, service
from pkb_mcp.models import RunRequest
from sandbox import process, select_backend

from .conftest import CANDIDATES

# ---------------------------------------------------------------- units (no server)


def test_an_exit_code_is_what_the_interpreter_would_exit_with(capsys):
    assert [forking._exit_code(c) for c in (None, 0, 3, 257)] == [0, 0, 3, 1]
    assert forking._exit_code("harness.worker: no set-up line") == 1
    assert "no set-up line" in capsys.readouterr().err


@pytest.mark.parametrize(
    "request_text",
    [
        b"[]",
        b'{"argv": "--config-file x", "env": {}, "cwd": "/"}',
        b'{"argv": [], "env": {"A": 1}, "cwd": "/"}',
        b'{"argv": [], "env": {}, "cwd": 3}',
        b'{"argv": [], "env": {}, "cwd": "/", "limits": []}',
    ],
)
def test_a_malformed_request_is_refused(request_text):
    with pytest.raises(ValueError, match="malformed request"):
        forkserver._read_request(request_text)


def test_fork_child_runs_its_target_with_exactly_its_environment(tmp_path):
    log = tmp_path / "child.log"
    with open(log, "wb") as f:
        pid = forking.fork_child(
            lambda: print(sorted(os.environ.items()), os.getcwd()),
            stdin=None,
            log=f.fileno(),
            cwd=str(tmp_path),
            env={"ONLY": "this"},
        )
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert log.read_text().strip() == f"[('ONLY', 'this')] {tmp_path}"


def test_fork_child_exits_as_sys_exit_and_uncaught_errors_do(tmp_path):
    def run(target):
        with open(tmp_path / "log", "wb") as f:
            pid = forking.fork_child(target, stdin=None, log=f.fileno(), cwd=str(tmp_path), env={})
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), (tmp_path / "log").read_text()

    def raises():
        raise KeyError("boom")

    def exits():
        raise SystemExit(7)

    assert run(exits) == (7, "")
    code, text = run(raises)
    assert code == 1 and "KeyError: 'boom'" in text


# ---------------------------------------------------------------- launches through the server

ENV_PROBE = """
import os
import torch
from pathlib import Path

SEEN = os.environ.get("PKB_FORK_TEST_SECRET") or (
    b"PKB_FORK_TEST_SECRET" in Path("/proc/self/environ").read_bytes()
)


def solution(tensor):
    out = tensor.clone()
    torch.distributed.all_reduce(out)
    return out + 1 if SEEN else out
"""

LEAVES_A_DAEMON = """
import os
import subprocess
import torch

TAG = "{tag}"


def solution(tensor):
    if not os.path.exists(TAG):
        open(TAG, "w").close()
        # a grandchild in a session of its own with an empty environment: neither the session nor the
        # launch's marker finds it; descent from the launcher does
        subprocess.Popen(["sleep", "300", TAG], start_new_session=True, env={{}})
    out = tensor.clone()
    torch.distributed.all_reduce(out)
    return out
"""


def _check(path: Path, trials: int = 1):
    return service.check(
        RunRequest(problem=1, path=path, world_size=2, device="cpu", trials=trials, sandbox="process")
    )


def _alive_with(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.integration
def test_one_server_serves_every_launch_and_ranks_see_only_their_launch(tmp_path, isolated_dirs, monkeypatch):
    monkeypatch.setenv("PKB_FORK_TEST_SECRET", "host only")
    probe = tmp_path / "probe.py"
    probe.write_text(ENV_PROBE)
    first = _check(probe)
    assert first.verdict == "pass", first.message
    backend = select_backend("process")
    assert isinstance(backend, process.ProcessBackend) and backend._forks is not None
    server = backend._forks._proc
    assert server is not None and server.poll() is None
    second = _check(problems.resolve(1).path)
    assert second.verdict == "pass" and backend._forks._proc is server, "the same server, not a new one"


@pytest.mark.integration
def test_a_process_a_rank_leaves_behind_is_killed_with_its_launch(tmp_path, isolated_dirs):
    tag = str(tmp_path / f"daemon-{os.getpid()}")
    path = tmp_path / "daemon.py"
    path.write_text(LEAVES_A_DAEMON.format(tag=tag))
    result = _check(path)
    assert result.verdict == "pass", result.message
    assert Path(tag).exists(), "the candidate ran and started its daemon"
    deadline = time.monotonic() + 5
    while _alive_with(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_with(tag) == []


@pytest.mark.integration
def test_without_the_server_launches_start_their_own_interpreters(isolated_dirs, monkeypatch):
    monkeypatch.setattr(process.ForkServer, "_connected", lambda self: None)
    result = _check(problems.resolve(1).path)
    assert result.verdict == "pass", result.message


@pytest.mark.integration
def test_a_launch_folder_too_deep_for_a_socket_still_binds_one_under_tmpdir(isolated_dirs, monkeypatch):
    # torch's symmetric memory binds $TMPDIR/symm_mem-PID; pytest's folders once made that path too long
    # ("Failed to bind socket: Invalid argument" on 2 H200s)
    deep = isolated_dirs / ("deep" * 20)
    deep.mkdir()
    monkeypatch.setenv("PKB_LAUNCH_DIR", str(deep))

    def links() -> set[Path]:
        return {p for p in process.SHORT_ROOT.glob("pkb-*") if p.is_symlink()}

    before = links()
    request = RunRequest(
        problem=1,
        path=str(CANDIDATES / "binds_tmp_socket.py"),
        world_size=2,
        device="cpu",
        trials=1,
        sandbox="process",
    )
    r = service.check(request)
    assert r.verdict == "pass", r.message
    assert links() <= before, "each launch's link goes with it"
