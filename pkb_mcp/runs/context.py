"""What a verb receives beside its request: where it reports progress, the event that cancels it,
and the function that gives its GPUs back before it ends.

A benchmark judges its timed outputs on the host after its last launch (reading every rank's tensors
and comparing them: about a second for a published-style file), and a batch's next job can use the
GPUs meanwhile: the scheduler (pkb_mcp/jobs/scheduler.py) hands each job a `release_gpus` that returns
the job's GPUs to its queue, and a run calls it once it launches nothing more. A direct call (the CLI,
a test) gets the defaults: no progress, no cancel, nothing to give back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

Progress = Callable[[float, float | None, str], None]


def no_progress(progress: float, total: float | None, message: str) -> None:
    return None


def _nothing_held() -> None:
    return None


@dataclass(frozen=True)
class JobContext:
    """A job's side of a verb's call (the request is the other): what it reports, what stops it, what
    it gives back. `release_gpus` may be called more than once (the scheduler's returns them once)."""

    progress: Progress = no_progress
    cancel: threading.Event | None = None
    release_gpus: Callable[[], None] = _nothing_held


DIRECT = JobContext()  # a call outside any scheduler
