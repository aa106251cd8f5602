"""Problem 1, correct, binding a Unix socket under TMPDIR as torch's symmetric memory does
($TMPDIR/symm_mem-PID): a launch folder too deep for a socket's path must not fail it."""

import os
import socket

import torch.distributed as dist


def solution(x):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"symm_mem-{os.getpid()}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
    os.unlink(path)
    out = x.clone()
    dist.all_reduce(out)
    return out
