"""Isolation backends: each runs one job (all ranks) and reports how it ended.

A backend is one module implementing `sandbox.base.Backend`. `process` is the fallback that
does not isolate; the Docker backend is the next one.
"""

from sandbox.base import Backend


def select_backend(name: str = "auto") -> Backend:
    """The backend called `name`; "auto" picks the most isolating one available."""
    from sandbox.process import ProcessBackend

    if name in ("auto", "process"):
        return ProcessBackend()
    raise ValueError(f"unknown sandbox backend {name!r}; choose auto or process")
