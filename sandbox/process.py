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
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sandbox.base import (
    CONFIG_NAME,
    LAUNCH_ENV,
    OUTER_GRACE_S,
    SandboxLaunch,
    SandboxRun,
    tail,
    write_config,
)
from sandbox.pool import Pooled, WarmSlot
from sandbox.toolchain import jit_env

FILE_SIZE_CAP = 16 << 30
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME")


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP, FILE_SIZE_CAP))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))


def _launch_processes(session: int, marker: str) -> list[int]:
    """Processes still alive from this launch: in its session or carrying its marker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == session or marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def kill_launch(session: int, marker: str) -> None:
    for _ in range(3):
        pids = _launch_processes(session, marker)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class ProcessBackend(Pooled):
    name = "process"
    isolated = False
    note = "process backend: candidate code ran as this user without isolation"

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
    ) -> subprocess.Popen[bytes]:
        tmp = launch_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        env.update(LAUNCH_ENV)
        env.update(
            {
                "HOME": str(launch_dir),
                "TMPDIR": str(tmp),
                "PYTHONPATH": str(harness_root),
                "PKB_LAUNCH": launch_id,
                "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"),
                "TRITON_CACHE_DIR": str(tmp / "triton"),
                "OMP_NUM_THREADS": str(threads),
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus) if device == "cuda" else "",
                **jit_env(),
            }
        )
        if self.extensions_dir is not None:
            env["PKB_EXTENSIONS"] = str(self.extensions_dir)
        args = ["--config-file", str(launch_dir / CONFIG_NAME)]
        if warm is not None:
            args += ["--warm", json.dumps(warm)]
        with open(launch_dir / "launcher.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "harness.launch", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=launch_dir,
                env=env,
                start_new_session=True,
                preexec_fn=_limits,
            )

    @staticmethod
    def _alive(proc: subprocess.Popen[bytes] | None) -> bool:
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
            proc.wait()
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
        deadline = t0 + launch.timeout_s + OUTER_GRACE_S
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if time.monotonic() > deadline:
                killed = True
                break
            time.sleep(0.02)
        kill_launch(proc.pid, f"PKB_LAUNCH={launch.launch_id}")  # the session id is the launcher's pid
        proc.wait()
        shutil.rmtree(launch.launch_dir / "tmp", ignore_errors=True)
        return SandboxRun(
            exit_code=proc.returncode,
            wall_s=time.monotonic() - t0,
            killed_at_deadline=killed,
            launcher_log=tail(launch.launch_dir / "launcher.log"),
            cancelled=cancelled,
            warm=launch.warm is not None,
        )
