"""GPU-only reward hacks (tests/adversarial/gpu/): run with `python -m pytest -m gpu` on a machine
with at least 2 GPUs. Each asserts the verdict the defence must give; docs/adversarial.md maps them.
The CPU hacks of tests/test_adversarial.py that touch GPU clocks are repeated here on CUDA."""

from pathlib import Path

import pytest

from pkb_mcp import service
from pkb_mcp.models import RunRequest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]
ADV = Path(__file__).resolve().parent / "adversarial"
GPU = ADV / "gpu"


def check(path, pid=1, trials=3):
    return service.check(
        RunRequest(problem=pid, path=path, world_size=2, device="cuda", trials=trials, timeout_s=300)
    )


def bench(path, pid=1, size="pkb"):
    return service.bench(
        RunRequest(problem=pid, path=path, world_size=2, device="cuda", size=size, timeout_s=300)
    )


def test_side_stream_work_is_judged_on_the_callers_stream():
    """The all-reduce runs on a side stream the caller's stream never waits for: the copy the
    harness queues on the caller's stream at return sees the empty output."""
    r = check(GPU / "side_stream.py")
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks), r.message


def test_remote_writes_in_flight_at_return_are_not_counted():
    """All-gather by pushing into peers' symmetric buffers with no closing barrier: rank 0 returns
    before its peer's (delayed) writes land."""
    r = check(GPU / "remote_writes_in_flight.py", pid=2)
    assert r.verdict == "fail" and r.ranks[0].state == "wrong", r.message


def test_stale_symmetric_buffer_reused_by_address_fails():
    """Inputs staged into a symmetric buffer once per address; the harness rotates the data behind
    the same addresses between timed rounds, so the staged copies go stale."""
    c = check(GPU / "stale_symmetric_buffer.py")
    if c.verdict == "pass":  # no trial's fresh input landed on a reused address: the bench catches it
        b = bench(GPU / "stale_symmetric_buffer.py")
        assert b.verdict == "fail" and "a timed call's output" in b.message, b.message
    else:
        assert any(x.state == "wrong" for x in c.ranks), c.message


def test_multicast_is_refused_on_gpus_too():
    r = check(GPU / "uses_multicast.py")
    assert r.verdict == "fail" and r.message.startswith("refused: multicast is unavailable")


def test_patched_cuda_events_are_caught():
    r = check(ADV / "patches_cuda_timers.py", trials=1)
    assert r.verdict == "fail" and all(x.state == "error" for x in r.ranks)
    assert "the solution replaced torch.cuda." in r.message


def test_output_cached_by_data_pointer_fails_on_gpus():
    r = bench(ADV / "cached_by_pointer.py")
    assert r.verdict == "fail" and "a timed call's output" in r.message, r.message


def test_honest_examples_are_not_suspect():
    """The speed-of-light guard, the fresh-input check and the tamper checks leave honest fast
    solutions alone (001 keeps a symmetric-memory buffer across calls)."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    r = bench(examples / "001_allreduce_symm_mem.py")
    assert r.verdict == "pass" and not r.below_floor and not r.faster_on_seen_inputs, r.message


@pytest.mark.parametrize("size", ["pkb", "large"])
@pytest.mark.parametrize("candidate", ["memoized_by_values.py", "gpu/memoized_burns_time.py"])
def test_memoized_outputs_are_not_credited_on_gpus(candidate, size):
    """Issue 17: outputs memoized by input values, plain (at large also below the floor) and burning
    GPU time on a hit to stay above the floor; fresh timed calls miss."""
    r = bench(ADV / candidate, size=size)
    assert r.verdict == "suspect" and r.faster_on_seen_inputs, r.message
    assert r.message.startswith("not credited: the candidate is")


@pytest.mark.parametrize("size", ["pkb", "large"])
def test_honest_state_kept_across_calls_is_not_flagged_on_gpus(size):
    r = bench(Path(__file__).resolve().parent / "candidates" / "caches_state.py", size=size)
    assert r.verdict == "pass" and not r.faster_on_seen_inputs, r.message
