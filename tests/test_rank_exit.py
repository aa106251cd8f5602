"""A rank that is exiting is over for a check's launch (harness/forking.py `gone`, harness/launch.py).

The kernel's end of a GPU rank (its CUDA context and communicators freed) takes 0.1-0.3 s after the
worker's exit call; a check's launch writes its record once nothing of its ranks can run again,
instead of waiting for that. These tests use real processes: a zombie is a process whose exit is
done but not yet collected, the furthest state a rank's exit can be seen in without a GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import forking


def _zombie() -> int:
    """A child of this process that has exited and is not yet collected."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _until_zombie(pid)
    return pid


def _until_zombie(pid: int) -> None:
    """Wait (up to 10 s) until the main thread of `pid` has ended."""
    give_up = time.monotonic() + 10
    while _state(pid) != "Z" and time.monotonic() < give_up:
        time.sleep(0.01)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return forking.stat_state(f.read())[0]


def test_a_stat_line_is_read_after_the_command_name_whatever_it_holds() -> None:
    line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194624 120 0 0 0 3 1 0 0 20 0 2 0 99 1 1"
    assert forking.stat_state(line) == ("S", 4194624)
    assert forking.stat_state("7 (x) R 1 7 7 0 -1 4194308 0") == ("R", 4194308)
    assert 4194308 & forking.PF_EXITING and not 4194624 & forking.PF_EXITING


def test_a_running_process_is_not_exiting_and_a_finished_one_is() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not forking.exiting(proc.pid) and not forking.gone(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert forking.exiting(proc.pid), "collected already: nothing of it runs"
    zombie = _zombie()
    try:
        assert forking.exiting(zombie) and forking.gone(zombie)
    finally:
        os.waitpid(zombie, 0)


def test_a_process_is_not_exiting_while_one_of_its_threads_still_runs() -> None:
    """Its main thread ended (a zombie thread) while another sleeps: code of it can still run."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "time.sleep(0.2)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        _until_zombie(proc.pid)
        assert _state(proc.pid) == "Z", "the main thread ended"
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert not forking.exiting(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_gone_leaves_a_running_process_and_its_children_alone() -> None:
    sleep = "import time; time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {sleep!r}]); time.sleep(9)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        give_up = time.monotonic() + 20
        while not forking.descendants(proc.pid) and time.monotonic() < give_up:
            time.sleep(0.02)
        (child,) = forking.descendants(proc.pid)
        assert not forking.gone(proc.pid)
        assert _state(child) in ("S", "R"), "a rank still running keeps its children"
    finally:
        for pid in forking.descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


LEAVING_RANKS = """
import io, json, os, sys, time
from pathlib import Path
from harness import forking, launch

def zombie():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid

class Rank:  # a worker whose status says ok and whose process the kernel is still ending
    def __init__(self):
        self.stdin, self.returncode, self.pid = io.BytesIO(), None, zombie()
        self.stdin.close = lambda: None
    def poll(self):  # its exit status is not known yet, until it is killed
        return self.returncode
    def send_signal(self, sig):
        pass
    def kill(self):
        self.returncode = -9
    def wait(self):
        return self.returncode

forking.become_subreaper()
cfg = json.loads(sys.argv[1])
for rank in range(2):
    (Path(cfg["launch_dir"]) / f"rank{rank}.status.json").write_text('{"state": "ok"}')
t0 = time.monotonic()
record = launch.launch(cfg, [Rank(), Rank()])
print(json.dumps({"record": record, "took_s": time.monotonic() - t0}))
"""


@pytest.mark.parametrize("token", ["5c" * 16, None])
def test_a_checks_launch_writes_its_record_while_its_ranks_exits_finish(
    tmp_path: Path, token: str | None
) -> None:
    """With an end token (a check's launch) ranks whose status is ok and whose processes are exiting
    are ended ok at once; without one (a benchmark's next launch is timed) the launcher waits for
    their exit, here to its deadline."""
    from tests.test_sandbox_records import launch_config, run_launcher_script

    cfg = launch_config(tmp_path, mode="outputs", timeout_s=2)
    if token is not None:
        cfg["end_token"] = token
    seen = run_launcher_script(LEAVING_RANKS, cfg)
    ranks = seen["record"]["ranks"]
    if token is not None:
        assert [(r["state"], r["exit_code"]) for r in ranks] == [("ok", 0), ("ok", 0)]
        assert seen["took_s"] < 1.5 and seen["record"]["end_token"] == token
    else:
        assert [r["state"] for r in ranks] == ["timeout", "timeout"] and seen["took_s"] >= 2
