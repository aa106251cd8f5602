"""Forking a fresh process from one that has imported torch: the child takes its own stdin, log,
working directory, environment, CPUs and limits, runs a target as an interpreter runs its main module,
and exits with its status (harness/forkserver.py forks launchers this way, harness/launch.py ranks).
Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import BinaryIO

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02


def become_subreaper() -> None:
    """Orphans of this process's descendants become its children, not init's (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


PR_SET_DUMPABLE = 4


def keep_private() -> None:
    """Other processes of this user can no longer read this process's memory or open its files
    through /proc (it is not dumpable): what it holds stays its own (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def children() -> list[int]:
    """This process's children (those of every thread)."""
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def reap_descendants(leaving: Collection[int] = ()) -> int:
    """Kill every child left (orphans came to this process as the subreaper), and theirs; how many.
    Children in `leaving` (already exiting: see `gone`) are not waited for; the others are."""
    killed = 0
    for _ in range(100):
        pids = [p for p in children() if p not in leaving]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        for pid in pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
    return killed


PF_EXITING = 0x4  # include/linux/sched.h: set as a thread enters do_exit, never cleared


def stat_state(text: str) -> tuple[str, int]:
    """A /proc/PID/stat line's state letter and kernel flags (the fields after the command's name,
    which may itself hold spaces and parentheses)."""
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[6])


def exiting(pid: int) -> bool:
    """Whether no thread of process `pid` will run its own code again: each is in the kernel's exit,
    or gone (Linux). A process's exit can take a while after that: the CUDA driver frees its contexts
    then, 0.1-0.3 s with communicators (docs/sandbox.md, "A launch's end")."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # reaped already
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state, flags = stat_state(f.read())
        except (OSError, ValueError, IndexError):
            continue  # that thread is gone
        if state not in ("Z", "X") and not flags & PF_EXITING:
            return False
    return True


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children of each of its threads, theirs, ...)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def gone(pid: int) -> bool:
    """Whether nothing of process `pid` can run again: it is exiting (`exiting`), and so is every
    process below it, each of which this kills first. A process that is exiting forks no more, so
    once every one found is exiting, none is left to be found."""
    if not exiting(pid):
        return False
    below = descendants(pid)
    for child in below:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
    return all(exiting(child) for child in below)


def _exit_code(code: object) -> int:
    """What the interpreter would exit with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(target: Callable[[], object]) -> int:
    """Run `target` as a fresh interpreter would run its main module, to its exit status: an
    uncaught exception is printed, then non-daemon threads are joined and atexit functions run."""
    import atexit
    import threading

    try:
        target()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # as the interpreter reports any uncaught exception
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return code


def fork_child(
    target: Callable[[], object],
    *,
    stdin: int | None,
    log: int,
    cwd: str,
    env: Mapping[str, str],
    cpus: list[int] | None = None,
    session: bool = False,
    limits: Mapping[str, int] | None = None,
    close: Sequence[int] = (),
) -> int:
    """Fork; the child takes `stdin` (or /dev/null), writes stdout and stderr to `log`, works in `cwd`
    with exactly `env`, keeps to `cpus`, then runs `target` and exits with its status. Returns the pid.
    The child closes the descriptors `close` first: the write ends of its own and its siblings' stdin
    pipes, which would otherwise keep each of them from ever reading the end of its input."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for fd in close:
            os.close(fd)
        if session:
            os.setsid()
        if limits:
            _set_limits(limits)
        if cpus:
            os.sched_setaffinity(0, cpus)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null if stdin is None else stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdin
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        code = _finish(target)
    except BaseException:  # a child must never return into its parent's code
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)


def _set_limits(limits: Mapping[str, int]) -> None:
    names = {"core": resource.RLIMIT_CORE, "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE}
    for key, value in limits.items():
        which = names[key]
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (soft, soft if key != "nofile" else hard))


class Signalled:
    """What a subprocess.Popen offers to signal a process by its pid, until its exit is known."""

    pid: int
    returncode: int | None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedWorker(Signalled):
    """A process forked by this one (fork_child), watched as a subprocess.Popen is."""

    def __init__(self, pid: int, stdin: BinaryIO):
        self.pid, self.stdin = pid, stdin
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        give_up = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if give_up is not None and time.monotonic() > give_up:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        assert self.returncode is not None
        return self.returncode
