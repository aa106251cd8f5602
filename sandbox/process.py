"""The process backend: no isolation, only containment. A clearly labelled fallback.

The launcher runs in a new session with resource limits (no core dumps, capped file sizes, a
bounded number of open files) and a scrubbed environment; at the deadline the launcher kills its
ranks, and if it has not finished shortly after, this backend kills every process of the session
and every process carrying the job's marker. Candidate code here can read what the user running
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

from sandbox.base import JOB_ENV, OUTER_GRACE_S, SandboxJob, SandboxRun, tail

FILE_SIZE_CAP = 16 << 30
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME")


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_CAP, FILE_SIZE_CAP))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))


def _job_processes(session: int, marker: str) -> list[int]:
    """Processes still alive from this job: in its session or carrying its marker."""
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


def kill_job(session: int, marker: str) -> None:
    for _ in range(3):
        pids = _job_processes(session, marker)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class ProcessBackend:
    name = "process"
    isolated = False
    note = "process backend: candidate code ran as this user without isolation"

    def run(self, job: SandboxJob, cancel: threading.Event | None = None) -> SandboxRun:
        marker = f"PKB_JOB={job.job_id}"
        tmp = job.job_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        env.update(JOB_ENV)
        env.update(
            {
                "HOME": str(job.job_dir),
                "TMPDIR": str(tmp),
                "PYTHONPATH": str(job.harness_root),
                "PKB_JOB": job.job_id,
                "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"),
                "TRITON_CACHE_DIR": str(tmp / "triton"),
                "OMP_NUM_THREADS": str(job.threads),
            }
        )
        if job.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in job.gpus)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.update(job.env)
        log_path = job.job_dir / "launcher.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.launch"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=job.job_dir,
                env=env,
                start_new_session=True,
                preexec_fn=_limits,
            )
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(job.config).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        killed = cancelled = False
        deadline = t0 + job.timeout_s + OUTER_GRACE_S
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if time.monotonic() > deadline:
                killed = True
                break
            time.sleep(0.05)
        kill_job(proc.pid, marker)  # the session id is the launcher's pid
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        return SandboxRun(
            exit_code=proc.returncode,
            wall_s=time.monotonic() - t0,
            killed_at_deadline=killed,
            launcher_log=tail(log_path),
            cancelled=cancelled,
        )
