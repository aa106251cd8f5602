"""Isolation backends: each runs one launch (all ranks) and reports how it ended.

A backend is one module implementing `sandbox.backend.Backend`, registered in `sandbox.backend.BACKENDS`:
`docker` (one hardened container per launch) and `process` (the fallback that does not isolate).
docs/sandbox.md says what each guarantees.
"""

import threading

from sandbox.backend import BACKENDS, Backend, backend_class


class SandboxUnavailable(RuntimeError):
    """The backend asked for cannot run here."""


_MADE: dict[str, Backend] = {}
_MADE_LOCK = threading.Lock()


def _made(name: str) -> Backend:
    with _MADE_LOCK:
        if name not in _MADE:
            _MADE[name] = backend_class(name)()
        return _MADE[name]


def made_backends() -> list[Backend]:
    """The backends this process has made (a server stopping ends each one's sandboxes)."""
    with _MADE_LOCK:
        return list(_MADE.values())


def select_backend(name: str = "auto") -> Backend:
    """The backend called `name` (a row of BACKENDS), or auto (docker when an engine answers, else
    process).

    Each backend is made once per process: the Docker backend's first use builds the local image if
    needed and removes containers that a dead server left behind.
    """
    if name not in ("auto", *BACKENDS):
        *others, last = ["auto", *BACKENDS]
        choices = f"{', '.join(others)} or {last}"
        raise SandboxUnavailable(f"unknown sandbox backend {name!r}; choose {choices}")
    if name != "auto" and name != "docker":
        return _made(name)
    try:
        return _made("docker")
    except Exception as exc:  # no engine, no SDK transport, no permission: all mean "not here"
        if name == "docker":
            raise SandboxUnavailable(
                f"the docker sandbox cannot run here: {exc}; start a Docker engine or pass --sandbox process"
            ) from exc
        return _made("process")
