"""GPU paths (run with `python -m pytest -m gpu` on a machine with at least 2 GPUs)."""

from pathlib import Path

import pytest

from pkb_mcp import problems, service

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("pid", sorted(problems.suite()))
def test_reference_passes_on_two_gpus(pid):
    r = service.check(pid, problems.suite()[pid].path, world_size=2, device="cuda", trials=2)
    assert r.verdict == "pass", r.message


def test_wrong_example_fails_on_gpus():
    r = service.check(1, EXAMPLES / "wrong_allreduce_half.py", world_size=2, device="cuda", trials=2)
    assert r.verdict == "fail" and r.ranks[0].first_mismatch is not None


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("[0-9][0-9][0-9]_*.py")))
def test_examples_pass_on_two_gpus(example):
    r = service.check(int(example[:3]), EXAMPLES / example, world_size=2, device="cuda", trials=3)
    assert r.verdict == "pass", r.message
