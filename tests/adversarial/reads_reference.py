"""Copies the reference's outputs instead of computing anything.

Looks for other jobs' output files in the job directories next to its own, found by listing the
parent directory and through the working directories of the processes in /proc. With the
reference's job running next to it and readable (the process backend, before the fix), this passed.
Expected: fail, every rank `error` ("no reference outputs found"), in both backends; the message
lists the job directories it could see.
"""

import os
import time
from pathlib import Path

import torch.distributed as dist

_calls = [0]


def _other_job_dirs():
    """Job directories next to this one (the same server's jobs): from a listing of the parent
    directory, and from the working directories of the processes in /proc."""
    here = Path.cwd().resolve()
    found = {p for p in here.parent.glob("pkb-launch-*") if p != here}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue
            if cwd != here and cwd.parent == here.parent and (cwd / "out").is_dir():
                found.add(cwd)
    return sorted(found)


def solution(x):
    from harness import tensorfile

    trial = _calls[0]
    _calls[0] += 1
    name = f"t{trial}_r{dist.get_rank()}.pkbt"
    deadline = time.monotonic() + 5.0
    seen = []
    while time.monotonic() < deadline:
        seen = _other_job_dirs()
        for job in seen:
            path = job / "out" / name
            if path.is_file():
                time.sleep(0.2)  # let the writer finish
                try:
                    _, tensors, _ = tensorfile.load(path, 1 << 30)
                except (OSError, ValueError):
                    continue
                return tensors[0]
        time.sleep(0.05)
    raise RuntimeError(f"no reference outputs found; other job directories visible: {seen}")
