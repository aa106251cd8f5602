"""A watcher that removes a pkb process's sandbox containers once that process is gone, however it
ended, SIGKILL included: Codex 0.171 kills its MCP server 18 ms after SIGTERM, before any cleanup,
and a warm sandbox left running holds its GPUs until the next `pkb serve` or `pkb doctor` sweeps it.

`watch(owner)` starts this file as a script (not the package: it imports only the standard library
and, at the end, the docker SDK) in a session of its own, so a signal to the server's process group
does not reach it. Its stdin is a pipe whose one writer is the watched process; at end of file (the
process exited, any way) it removes every container labelled with that process's owner id and
exits. A process that removed its containers itself leaves it nothing to do.
"""

from __future__ import annotations

import os
import subprocess
import sys

_held: list[int] = []  # the pipe's write end, open for the life of the watched process


def watch(label: str, owner: str) -> subprocess.Popen[bytes] | None:
    """Start the watcher of this process's containers (`label`=`owner`); None where it cannot start."""
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(
            # -P: this file's folder holds sandbox/docker.py, which must not stand in for the SDK
            [sys.executable, "-P", os.path.abspath(__file__), label, owner],
            stdin=read,
            # only what reaches the engine: no mark of an agent's attempt, no token, nothing else
            env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME") or k.startswith("DOCKER_")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        os.close(write)
        return None
    finally:
        os.close(read)
    _held.append(write)
    return proc


def _reap(label: str, owner: str) -> int:
    import docker

    client = docker.from_env(timeout=60)
    removed = 0
    for container in client.containers.list(all=True, filters={"label": f"{label}={owner}"}):
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.APIError:
            pass
    return removed


def main(argv: list[str]) -> int:
    label, owner = argv[1], argv[2]
    while os.read(0, 1 << 16):  # until the watched process is gone and its end of the pipe with it
        pass
    try:
        _reap(label, owner)
    except Exception:  # no engine: nothing of ours can be running on it
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
