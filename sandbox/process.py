"""The process backend: no isolation, only containment. A clearly labelled fallback.

The launcher runs in a new session with resource limits (no core dumps, capped file sizes, a
bounded number of open files) and a scrubbed environment; at the deadline the launcher kills its
ranks, and if it has not finished shortly after, this backend kills every process of the session
and every process carrying the launch's marker. Candidate code here can read what the user running
pkb can read: use the Docker backend for untrusted code.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import structlog

from harness.extensions import VIEW
from harness.forking import Signalled
from sandbox.backend import Backend
from sandbox.base import (
    CONFIG_NAME,
    FILE_SIZE_CAP,
    LAUNCH_ENV,
    OUTER_GRACE_S,
    DiskGuard,
    SandboxLaunch,
    SandboxRun,
    tail,
    write_config,
)
from sandbox.pool import Pooled, WarmSlot
from sandbox.toolchain import jit_env

log = structlog.get_logger("sandbox.process")
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME")


LIMITS = {"core": 0, "fsize": FILE_SIZE_CAP, "nofile": 8192}
FORK_SERVER_START_S = 120.0  # importing torch on a loaded 2-core host
FORK_REPLY_S = 30.0


# A Unix socket's path holds at most 107 bytes. torch's symmetric memory binds one at
# $TMPDIR/symm_mem-PID and ncu's rank folders add a level: a launch folder deeper than this leaves too
# little room ("Failed to bind socket: Invalid argument", seen on 2 H200s with pytest's folders), so its
# ranks reach their tmp folder through a short link in /tmp instead.
SOCKET_PATH_MAX = 107
SOCKET_ROOM = 48  # what goes under TMPDIR: "/ncu-r7/symm_mem-" and a pid (7 digits), with room to spare
SHORT_ROOT = Path("/tmp")


def _short_link(launch_id: str) -> Path:
    return SHORT_ROOT / f"pkb-{launch_id}"


def short_tmp(launch_id: str, tmp: Path) -> Path:
    """The TMPDIR of a launch whose own tmp folder is `tmp`: that folder, or a short link to it."""
    if len(str(tmp)) + SOCKET_ROOM <= SOCKET_PATH_MAX:
        return tmp
    link = _short_link(launch_id)
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(tmp, target_is_directory=True)
    return link


def _drop_short_tmp(launch_id: str) -> None:
    link = _short_link(launch_id)
    if link.is_symlink():
        link.unlink(missing_ok=True)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP, FILE_SIZE_CAP))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LIMITS["nofile"], hard), hard))


def _launch_processes(session: int, marker: str) -> list[int]:
    """Processes still alive from this launch: in its session, descended from its launcher (whose pid
    is the session id; a launcher forked by the fork server is a subreaper, so its ranks' orphans stay
    its descendants), or carrying its marker in their environment."""
    parents: dict[int, int] = {}
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(fields[1])
            if int(fields[3]) == session or marker.encode() in (entry / "environ").read_bytes():
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    for pid in parents:
        ancestor, hops = parents.get(pid), 0
        while ancestor is not None and ancestor > 1 and hops < 64:
            if ancestor == session:
                found.add(pid)
                break
            ancestor, hops = parents.get(ancestor), hops + 1
    return sorted(found)


def kill_launch(session: int, marker: str) -> None:
    for _ in range(3):
        pids = _launch_processes(session, marker)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class Launched(Signalled):
    """A launcher the fork server started, watched as a subprocess.Popen is (poll, wait, pid)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode = None
        self._ended = threading.Event()

    def end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.returncode


class ForkServer:
    """harness/forkserver.py, started on first use with the launches' scrubbed environment (torch
    imported once there; every launcher a fork of it) and started again if it died. `launch` returns
    None when the server cannot be had: the backend then starts the launcher as a new interpreter."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self._env, self._cwd = env, cwd
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._replies: queue.Queue[Launched | str] = queue.Queue()
        self._running: dict[int, Launched] = {}

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, log: int) -> Launched | None:
        with self._lock:
            sock = self._connected()
            if sock is None:
                return None
            request = {"argv": argv, "env": env, "cwd": str(cwd), "limits": LIMITS}
            try:
                socket.send_fds(sock, [json.dumps(request).encode()], [log])
                reply = self._replies.get(timeout=FORK_REPLY_S)
            except (OSError, queue.Empty):
                self._stop()
                return None
            if isinstance(reply, str):
                raise RuntimeError(f"the fork server refused a launch: {reply}")
            return reply

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _connected(self) -> socket.socket | None:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "harness.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
            )
        except OSError as exc:
            log.warning("fork server not started", error=str(exc))
            ours.close()
            return None
        finally:
            theirs.close()
        ours.settimeout(FORK_SERVER_START_S)
        try:
            ready = json.loads(ours.recv(4096) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if "ready" not in ready:
            log.warning("fork server did not start; launches start their own interpreters")
            ours.close()
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            return None
        ours.settimeout(None)
        self._sock = ours
        threading.Thread(target=self._read, args=(ours,), name="pkb-forkserver", daemon=True).start()
        return ours

    def _read(self, sock: socket.socket) -> None:
        """Route the server's replies: a fork's pid to the waiting request, an exit to its launcher."""
        while True:
            try:
                data = sock.recv(4096)
                message = json.loads(data) if data else None
            except (OSError, ValueError):
                message = None
            if not isinstance(message, dict):
                break
            pid = message.get("pid")
            if "error" in message:
                self._replies.put(str(message["error"])[:500])
            elif isinstance(pid, int) and "exit" in message:
                launched = self._running.pop(pid, None)
                if launched is not None:
                    launched.end(int(message["exit"]))
            elif isinstance(pid, int):
                self._running[pid] = Launched(pid)
                self._replies.put(self._running[pid])
        # the server is gone: what it had started can no longer be watched through it
        for pid, launched in list(self._running.items()):
            kill_launch(pid, "")
            launched.end(-signal.SIGKILL)
        self._running.clear()

    def _stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


class ProcessBackend(Pooled, Backend):
    name = "process"
    isolated = False
    note = "process backend: candidate code ran as this user without isolation"
    _forks: ForkServer | None = None

    def end_all(self, timeout_s: float) -> int:
        """The warm launchers (disable_pool) and the fork server, whose launches' sessions it ends
        (a launch in flight is killed by its own run on its cancel event)."""
        self.disable_pool()
        if self._forks is not None:
            self._forks.close()
            self._forks = None
        return 0

    def _start(
        self,
        launch_id: str,
        launch_dir: Path,
        device: str,
        gpus: list[int],
        threads: int,
        cpus: tuple[tuple[int, ...], ...],
        harness_root: Path,
        warm: dict | None,
    ) -> subprocess.Popen[bytes] | Launched:
        tmp = launch_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        env.update(LAUNCH_ENV)
        env.update(
            {
                "HOME": str(launch_dir),
                "TMPDIR": str(short_tmp(launch_id, tmp)),
                "PYTHONPATH": str(harness_root),
                "PKB_LAUNCH": launch_id,
                "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"),
                "TRITON_CACHE_DIR": str(tmp / "triton"),
                "OMP_NUM_THREADS": str(threads),
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus) if device == "cuda" else "",
                **jit_env(),
            }
        )
        if self.extensions_dir is not None:  # the launch's own entries (pkb_mcp/launches.py show_entries)
            env["PKB_EXTENSIONS"] = str(launch_dir / VIEW)
        args = ["--config-file", str(launch_dir / CONFIG_NAME)]
        if warm is not None:
            args += ["--warm", json.dumps(warm)]
        with open(launch_dir / "launcher.log", "wb") as launcher_log:
            forked = self._fork_server(harness_root).launch(args, env, launch_dir, launcher_log.fileno())
            if forked is not None:
                return forked
            return subprocess.Popen(
                [sys.executable, "-m", "harness.launch", *args],
                stdin=subprocess.DEVNULL,
                stdout=launcher_log,
                stderr=subprocess.STDOUT,
                cwd=launch_dir,
                env=env,
                start_new_session=True,
                preexec_fn=_limits,
            )

    def _fork_server(self, harness_root: Path) -> ForkServer:
        """One per backend, its environment what every launch shares (nothing of any one launch)."""
        if self._forks is None:
            env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
            env.update(LAUNCH_ENV)
            home = Path(tempfile.mkdtemp(prefix="pkb-forkserver-"))
            env.update({"HOME": str(home), "TMPDIR": str(home), "PYTHONPATH": str(harness_root)})
            env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **jit_env()})
            self._forks = ForkServer(env, home)
        return self._forks

    @staticmethod
    def _alive(proc: subprocess.Popen[bytes] | Launched | None) -> bool:
        return proc is not None and proc.poll() is None

    @staticmethod
    def _describe(slot: WarmSlot) -> str:
        """How a launcher that stopped ended: its exit status and last lines."""
        if slot.handle is None:
            return "never started"
        return f"exit status {slot.handle.poll()}; launcher: {tail(slot.launch_dir / 'launcher.log', 2000)}"

    def _discard(self, slot: WarmSlot) -> None:
        proc = slot.handle
        if proc is not None:
            kill_launch(proc.pid, f"PKB_LAUNCH={slot.launch_id}")
            if proc.poll() is None:
                # the fork server answers before its child has a session of its own, and a forked
                # launcher's environment in /proc is the server's (no marker): `kill_launch` may find
                # it by neither, and it would wait for a launch until its idle end
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        _drop_short_tmp(slot.launch_id)
        shutil.rmtree(slot.launch_dir, ignore_errors=True)

    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        t0 = time.monotonic()
        write_config(
            launch.launch_dir, launch.config
        )  # a warm launcher is waiting for it; a cold one reads it
        if launch.warm is not None:
            proc = launch.warm
        else:
            proc = self._start(
                launch.launch_id,
                launch.launch_dir,
                launch.device,
                launch.gpus,
                launch.threads,
                launch.cpus,
                launch.harness_root,
                None,
            )
        killed = cancelled = False
        exceeded: str | None = None
        deadline = t0 + launch.timeout_s + OUTER_GRACE_S
        disk = DiskGuard(launch.launch_dir)
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if (exceeded := disk.over()) is not None:
                break
            if time.monotonic() > deadline:
                killed = True
                break
            time.sleep(0.02)
        kill_launch(proc.pid, f"PKB_LAUNCH={launch.launch_id}")  # the session id is the launcher's pid
        proc.wait()
        _drop_short_tmp(launch.launch_id)
        shutil.rmtree(launch.launch_dir / "tmp", ignore_errors=True)
        return SandboxRun(
            exit_code=proc.returncode,
            wall_s=time.monotonic() - t0,
            killed_at_deadline=killed,
            launcher_log=tail(launch.launch_dir / "launcher.log"),
            cancelled=cancelled,
            exceeded=exceeded,
            warm=launch.warm is not None,
        )
