"""Where an agent's client runs: `Launched` is what an attempt holds of it, on the host (this module:
a process group of its own) or in a container of its own (pkb_mcp/agents/container.py). Either way
the attempt reads its stdout as it comes, waits for it up to the wall limit, and then ends it with
everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Protocol

END_GRACE_S = 3.0  # from SIGTERM to SIGKILL: a client that stops its own children gets this long


class Launched(Protocol):
    """A started client. `stdout` yields its output's bytes as they come; `kill_all` ends it and every
    process it started (idempotent); `leftovers` names what is still running after that."""

    stdout: IO[bytes]

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill_all(self) -> None: ...

    def leftovers(self) -> list[str]: ...


MARKER = "PKB_AGENT_ATTEMPT"  # in the client's environment, with the attempt's id: its descendants inherit it


class HostProcess:
    """The client as the user, in a process group (and session) of its own; stderr to a file. What it
    starts is found by its group and by `MARKER` in its environment (a child that leaves the group with
    setsid keeps its environment), and ended with it."""

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: Path, stderr: Path, stdin: bytes | None, marker: str
    ):
        self.marker = f"{MARKER}={marker}".encode()
        env = {**env, MARKER: marker}
        self._stderr = stderr.open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout
        if stdin is not None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(stdin)
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.pgid = self.proc.pid  # a new session: its group is its pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def kill_all(self) -> None:
        """SIGTERM to the group and the marked, then SIGKILL to whatever of them is left after
        END_GRACE_S."""
        for sig, grace in ((signal.SIGTERM, END_GRACE_S), (signal.SIGKILL, 1.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.leftovers():
                time.sleep(0.05)
            if not self.leftovers():
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._stderr.close()

    def leftovers(self) -> list[str]:
        """The processes of its group, or marked, still alive (zombies not counted): `pid command`."""
        return [f"{pid} {comm}" for pid, comm in self._alive()]

    def _pids(self) -> list[int]:
        return [pid for pid, _ in self._alive()]

    def _alive(self) -> list[tuple[int, str]]:
        found = []
        own = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            head, _, rest = stat.rpartition(")")
            fields = rest.split()
            if len(fields) < 3 or fields[0] == "Z":
                continue
            if int(fields[2]) == self.pgid or self._marked(entry):
                found.append((int(entry.name), head.partition("(")[2]))
        return found

    def _marked(self, entry: Path) -> bool:
        try:
            return self.marker in (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            return False
