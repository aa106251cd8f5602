"""The one interface every sandbox backend implements, and the registry of backends.

A backend runs one launch (all of its ranks) and reports how it ended (`run`). What else it can do it
declares here, each capability with the default of a backend that lacks it, so the host asks a
backend what it can do and never probes it for attributes:

| capability | default | means |
| --- | --- | --- |
| `isolated` | False | the candidate cannot reach the host (Docker) or can (the process fallback) |
| `ends_early` | False | `run` may return at the launcher's clean end, the sandbox ended later |
| `enable_pool` | None | keeps sandboxes started ahead of need (sandbox/pool.py `Pooled`) |
| `end_all` | the pool's | ends every sandbox of this process's, for a server that stops |
| `extensions_dir` | None | the node's extension cache, set by the host |

Adding a backend is one module with one class deriving from `Backend`, and its row in `BACKENDS`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import ClassVar

from sandbox.base import SandboxLaunch, SandboxRun
from sandbox.pool import WarmKey, WarmPool


class Backend(abc.ABC):
    """A sandbox backend (module docstring): a name, a one-line note every result carries, what it
    can do, and `run`."""

    name: ClassVar[str]
    note: ClassVar[str]
    isolated: ClassVar[bool] = False
    ends_early: ClassVar[bool] = False
    pool: WarmPool | None = None  # its warm sandboxes, once enable_pool made them
    extensions_dir: Path | None = None  # the node's extension cache (pkb_mcp/compile/extensions.py)

    @abc.abstractmethod
    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        """Run the launch to its end, its deadline, or until `cancel` is set; always clean up."""

    def enable_pool(
        self,
        new_dir: Callable[[str], Path],
        harness_root: Path,
        per_key: int | Callable[[WarmKey], int] = 2,
        spare: int | Callable[[WarmKey], int] = 0,
    ) -> WarmPool | None:
        """Keep sandboxes started ahead of need; None where the backend cannot."""
        return None

    def disable_pool(self) -> None:  # noqa: B027 - a capability whose default is to do nothing
        """Stop every warm sandbox (none by default)."""

    def settle_ended(self) -> None:  # noqa: B027 - as disable_pool
        """Return once the sandboxes of launches that ended early have ended too (none by default)."""

    def end_all(self, timeout_s: float) -> int:
        """End every sandbox this process started that is still there (a server stopping: its warm
        ones, those of launches its jobs left, those ending in the background), within about
        `timeout_s`; how many it ended. By default, the pool's (disable_pool)."""
        self.disable_pool()
        return 0


# name -> "module:class", imported on first use (the Docker SDK is not imported where it is not used)
BACKENDS: dict[str, str] = {
    "docker": "sandbox.docker:DockerBackend",
    "process": "sandbox.process:ProcessBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The class registered as `name` in BACKENDS; KeyError for an unknown name."""
    module, _, cls = BACKENDS[name].partition(":")
    found = getattr(import_module(module), cls)
    assert isinstance(found, type) and issubclass(found, Backend), f"{BACKENDS[name]} is no Backend"
    return found
