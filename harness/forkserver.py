"""A fork server for the process backend: torch imported once, every launcher and rank a fresh fork.

A launch's ranks each used to start an interpreter and import torch: about 3 s of CPU per rank, most
of a small check's time on a CPU host. The process backend starts this server once (sandbox/process.py)
with the launches' scrubbed environment; it imports torch and then only forks. No candidate code ever
runs in it, so a fork of it is a process that has imported torch and done nothing else: each launcher
is such a fork, and each rank a fork of its launcher (harness/forking.py), never a process a candidate
ran in.

Protocol, over a SOCK_SEQPACKET socket (one message per request or reply, JSON):
    request  {"argv": [...], "env": {...}, "cwd": DIR, "limits": {"core": n, "fsize": n, "nofile": n}}
             with one file descriptor attached: the launcher's log (its stdout and stderr)
    replies  {"pid": PID} once forked (or {"error": "..."}), then {"pid": PID, "exit": CODE} when it ends
             (CODE as subprocess reports it: negative for a signal)

Each launcher is its own session and a child subreaper, so whatever its ranks leave behind stays its
descendant (sandbox/process.py kills a launch by session and by descent). The server is a subreaper
too: a process orphaned by a launcher that ended is killed. It exits when the socket closes (its host
ended). Stdlib and torch only.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from harness import forking, launch

MAX_REQUEST_BYTES = 1 << 20
ORPHAN_SCAN_S = 0.5
REAP_S = 0.005  # how soon an ended launcher is reported while any runs


def _run_launcher(argv: list[str]) -> None:
    forking.become_subreaper()
    launch.main(argv, fork_workers=True)


def _read_request(data: bytes) -> dict[str, object]:
    request = json.loads(data)
    if not (
        isinstance(request, dict)
        and isinstance(request.get("argv"), list)
        and all(isinstance(a, str) for a in request["argv"])
        and isinstance(request.get("env"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in request["env"].items())
        and isinstance(request.get("cwd"), str)
        and isinstance(request.get("limits", {}), dict)
    ):
        raise ValueError("malformed request")
    return request


class Server:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.launchers: set[int] = set()

    def handle(self) -> bool:
        """Serve one request; False once the socket is closed."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_REQUEST_BYTES, 1)
        except OSError:
            return False
        if not data:
            return False
        try:
            request = _read_request(data)
            if len(fds) != 1:
                raise ValueError("a request carries exactly one file descriptor (the log)")
            pid = forking.fork_child(
                lambda: _run_launcher(request["argv"]),  # type: ignore[arg-type]
                stdin=None,
                log=fds[0],
                cwd=request["cwd"],  # type: ignore[arg-type]
                env=request["env"],  # type: ignore[arg-type]
                session=True,
                limits=request.get("limits") or {},  # type: ignore[arg-type]
            )
            self.launchers.add(pid)
            self._send({"pid": pid})
        except (ValueError, OSError) as exc:
            self._send({"error": str(exc)})
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def reap(self) -> None:
        """Report every launcher that ended; orphans reparented here are simply reaped."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.launchers:
                self.launchers.discard(pid)
                self._send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})

    def kill_orphans(self) -> None:
        """Kill processes left by a launcher that has ended (they are this server's children now)."""
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.launchers:
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == me:
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _send(self, message: dict[str, object]) -> None:
        with contextlib.suppress(OSError):
            self.sock.send(json.dumps(message).encode())

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        scanned = time.monotonic()
        while True:
            events = selector.select(REAP_S if self.launchers else ORPHAN_SCAN_S)
            if events and not self.handle():
                return
            self.reap()
            if time.monotonic() - scanned > ORPHAN_SCAN_S:
                self.kill_orphans()
                scanned = time.monotonic()


def main(argv: list[str]) -> None:
    """`python -m harness.forkserver FD`: serve the socket FD (inherited) until it closes."""
    sock = socket.socket(fileno=int(argv[0]))
    forking.become_subreaper()
    # the point of this server: torch imported once, before any fork
    import torch.distributed  # noqa: F401

    sock.send(json.dumps({"ready": os.getpid()}).encode())
    Server(sock).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
