"""The GPUs a run holds, given back before the run ends where what is left of it needs none.

A benchmark judges its timed outputs on the host after its last launch (reading every rank's tensors
and comparing them: about a second for a published-style file), and a batch's next job can use the
GPUs meanwhile. The scheduler (pkb_mcp/jobs/scheduler.py) runs each job inside `holding`, with the
function that returns the job's GPUs to its queue; a run calls `give_back` once it launches nothing
more. Outside a scheduler's job (a direct service call) `give_back` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_give_back: ContextVar[Callable[[], None] | None] = ContextVar("pkb_gpu_give_back", default=None)


@contextmanager
def holding(give_back_gpus: Callable[[], None]) -> Iterator[None]:
    """Run the body as a job whose GPUs `give_back_gpus` returns (the scheduler's returns them once,
    however often it is called)."""
    token = _give_back.set(give_back_gpus)
    try:
        yield
    finally:
        _give_back.reset(token)


def give_back() -> None:
    """The run launches nothing more: its GPUs may go to the next job."""
    returns = _give_back.get()
    if returns is not None:
        returns()
