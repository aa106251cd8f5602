"""GPU paths (run with `python -m pytest -m gpu` on a machine with at least 2 GPUs).

Each problem runs at the smallest world size its rule allows on this node (as tests/test_end_to_end.py
does on CPU): 48, for instance, needs an even world size of 4 or more and is skipped, with its rule,
on 2 GPUs.
"""

from pathlib import Path

import pytest

from pkb_mcp import problems, service

torch = pytest.importorskip("torch")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def world_size_for(pid: int, size: str = "pkb", gpus: int = GPUS) -> int | None:
    """The smallest world size from 2 to `gpus` that problem `pid`'s rule allows, or None."""
    p = problems.suite()[pid]
    return next((w for w in range(2, gpus + 1) if not p.world_size_error(w, size)), None)


def world_size_or_skip(pid: int) -> int:
    ws = world_size_for(pid)
    if ws is None:
        p = problems.suite()[pid]
        pytest.skip(f"problem {pid} needs another world size than 2..{GPUS} GPUs allow ({p.world_sizes})")
    return ws


@pytest.mark.parametrize("pid", sorted(problems.suite()))
def test_reference_passes_on_gpus(pid):
    ws = world_size_or_skip(pid)
    r = service.check(pid, problems.suite()[pid].path, world_size=ws, device="cuda", trials=2)
    assert r.verdict == "pass", r.message


def test_wrong_example_fails_on_gpus():
    r = service.check(1, EXAMPLES / "wrong_allreduce_half.py", world_size=2, device="cuda", trials=2)
    assert r.verdict == "fail" and r.ranks[0].first_mismatch is not None


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("[0-9][0-9][0-9]_*.py")))
def test_examples_pass_on_gpus(example):
    pid = int(example[:3])
    ws = world_size_or_skip(pid)
    r = service.check(pid, EXAMPLES / example, world_size=ws, device="cuda", trials=3)
    assert r.verdict == "pass", r.message
