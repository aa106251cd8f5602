"""Isolation backends: each runs one launch (all ranks) and reports how it ended.

A backend is one module implementing `sandbox.base.Backend`: `docker` (one hardened container per
launch) and `process` (the fallback that does not isolate). docs/sandbox.md says what each guarantees.
"""

import functools

from sandbox.base import Backend


class SandboxUnavailable(RuntimeError):
    """The backend asked for cannot run here."""


@functools.cache
def _docker() -> Backend:
    from sandbox.docker import DockerBackend

    return DockerBackend()


@functools.cache
def _process() -> Backend:
    from sandbox.process import ProcessBackend

    return ProcessBackend()


def select_backend(name: str = "auto") -> Backend:
    """The backend called `name`: docker, process, or auto (docker when an engine answers, else process).

    The Docker backend is made once per process: the first use builds the local image if needed and
    removes containers that a dead server left behind.
    """
    if name == "process":
        return _process()
    if name not in ("auto", "docker"):
        raise SandboxUnavailable(f"unknown sandbox backend {name!r}; choose auto, docker or process")
    try:
        return _docker()
    except Exception as exc:  # no engine, no SDK transport, no permission: all mean "not here"
        if name == "docker":
            raise SandboxUnavailable(
                f"the docker sandbox cannot run here: {exc}; start a Docker engine or pass --sandbox process"
            ) from exc
        return _process()
