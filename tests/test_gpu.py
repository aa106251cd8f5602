"""GPU paths (`python -m pytest -m gpu` on a GPU node): most need 2 GPUs; the one-GPU tests open
problem 1 to a single rank.

Each problem runs at the smallest world size its rule allows on this node (as tests/test_end_to_end.py
does on CPU): 48, for instance, needs an even world size of 4 or more and is skipped, with its rule,
on 2 GPUs.
"""

import json
from pathlib import Path

import pytest

from pkb_mcp import problems, service
from pkb_mcp.models import RunRequest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


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


@two_gpus
@pytest.mark.parametrize("pid", sorted(problems.suite()))
def test_reference_passes_on_gpus(pid):
    ws = world_size_or_skip(pid)
    r = service.check(
        RunRequest(problem=pid, path=problems.suite()[pid].path, world_size=ws, device="cuda", trials=2)
    )
    assert r.verdict == "pass", r.message


@two_gpus
def test_wrong_example_fails_on_gpus():
    r = service.check(
        RunRequest(
            problem=1, path=EXAMPLES / "wrong_allreduce_half.py", world_size=2, device="cuda", trials=2
        )
    )
    assert r.verdict == "fail" and r.ranks[0].first_mismatch is not None


@two_gpus
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("[0-9][0-9][0-9]_*.py")))
def test_examples_pass_on_gpus(example):
    pid = int(example[:3])
    ws = world_size_or_skip(pid)
    r = service.check(
        RunRequest(problem=pid, path=EXAMPLES / example, world_size=ws, device="cuda", trials=3)
    )
    assert r.verdict == "pass", r.message


def built_once_then_cached(world_size: int) -> None:
    """The CUDA example checked twice in Docker: built by a build launch before the first check, loaded
    from the node's cache by the next; then compile_kernel reports its kernel's resources."""
    example = EXAMPLES / "001_allreduce_cuda_oneshot.py"
    first = service.check(
        RunRequest(problem=1, path=example, world_size=world_size, device="cuda", trials=3, sandbox="docker")
    )
    assert first.verdict == "pass", (first.message, first.notes, [r.log_tail for r in first.ranks])
    assert any("built extension pkb_example_oneshot_allreduce" in n for n in first.notes), first.notes
    again = service.check(
        RunRequest(problem=1, path=example, world_size=world_size, device="cuda", trials=3, sandbox="docker")
    )
    assert again.verdict == "pass", again.message
    assert any("loaded from the build cache" in n for n in again.notes), again.notes
    assert again.wall_s < first.wall_s / 2, (first.wall_s, again.wall_s)
    compiled = service.compile_file(RunRequest(path=example, sandbox="docker"))
    assert compiled.ok and compiled.units[0].kernels, compiled.summary()


@two_gpus
def test_cuda_load_inline_builds_once_and_runs_in_docker():
    """A hand-written CUDA kernel built with load_inline on first call, in the Docker sandbox."""
    built_once_then_cached(2)


@pytest.fixture
def one_rank_problem_1(tmp_path, monkeypatch):
    """Problem 1 with its world-size rule opened to one rank (an all-reduce over one rank is a copy),
    for GPU paths that must be shown where only one GPU is lent."""
    single = tmp_path / "problems"
    single.mkdir()
    text = (Path(problems.suite()[1].path)).read_text()
    text = text.replace('return None if world_size >= 2 else "needs at least 2 ranks"', "return None")
    (single / "001_allreduce.py").write_text(text)
    monkeypatch.setenv("PKB_PROBLEMS_DIR", str(single))


@one_gpu
def test_cuda_load_inline_on_one_gpu_in_docker(one_rank_problem_1):
    """The built-then-cached path on a node of one GPU: discovery, the CUDA build launch, the read-only
    cache and the kernel's run in the sandbox."""
    built_once_then_cached(1)


@one_gpu
def test_original_benchmark_helper_builds_cuda_on_one_gpu(one_rank_problem_1):
    """A file in the original benchmark's style (utils.cuda_helpers.compile_cuda_extension on first
    call) builds its CUDA through the cache and runs in Docker."""
    candidate = Path(__file__).parent / "candidates" / "original_helper_cuda.py"
    result = service.check(
        RunRequest(problem=1, path=candidate, world_size=1, device="cuda", trials=2, sandbox="docker")
    )
    assert result.verdict == "pass", (result.message, result.notes, [r.log_tail for r in result.ranks])
    assert any("built extension original_style_ext" in n for n in result.notes), result.notes


@one_gpu
def test_hostile_outputs_and_logs_fail_on_one_gpu_in_docker(one_rank_problem_1, tmp_path, monkeypatch):
    """Issue 49 on a GPU, in the Docker sandbox: a lazy tensor subclass (its all-reduce deferred to the
    harness's first touch, after the clock) fails at return in check and bench; a rank log swapped for
    a link to the server's environment fails the check and brings nothing of the host back."""
    adversarial = Path(__file__).parent / "adversarial" / "lazy_tensor.py"
    words = "output 0 is a LazyTensor, a subclass of torch.Tensor; return plain tensors"
    run = {"problem": 1, "path": adversarial, "world_size": 1, "device": "cuda", "sandbox": "docker"}
    checked = service.check(RunRequest(**run, trials=1))
    assert checked.verdict == "fail" and words in checked.message, checked.message
    benched = service.bench(RunRequest(**run))
    assert benched.verdict == "fail" and benched.speedup is None and words in benched.message, benched.message
    monkeypatch.setenv("PKB_TOKEN", "pkb-gpu-canary-7a1c")
    swaps = tmp_path / "swaps.py"
    swaps.write_text(
        "import os\nimport torch.distributed as dist\n\ndef solution(x):\n"
        "    os.unlink('/launch/rank0.log')\n    os.symlink('/proc/self/environ', '/launch/rank0.log')\n"
        "    out = x.clone()\n    dist.all_reduce(out)\n    return out\n"
    )
    swapped = service.check(RunRequest(**{**run, "path": swaps}, trials=1))
    assert swapped.verdict == "fail" and "rank0.log was replaced by a symbolic link" in swapped.message
    assert "pkb-gpu-canary-7a1c" not in json.dumps(swapped.model_dump(mode="json"))
