"""Ranks on CPU cores of their own (sandbox/cpus.py, PKB_PIN_CPUS): how the node's cores are split,
and that every thread of every rank keeps to its block, cold or warm, with processes or containers
(where the launch's cpuset also stops a rank from widening its own affinity). The splitting and the
reading of reports are fast; the launches are integration."""

import os
import re

import pytest

from pkb_mcp import config
from pkb_mcp.launches import enable_warm_pool, run_launch, warm_key
from sandbox import cpus, select_backend
from sandbox.process import ProcessBackend

from .conftest import cpu_launch, docker_client


def hyperthreads(n_cores):
    """A node numbered like Linux numbers a two-way SMT machine: CPU c and c + n_cores share a core."""
    return lambda c: sorted({c % n_cores, c % n_cores + n_cores})


def test_cpulist_format_both_ways():
    assert cpus.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpus.parse_cpulist("5") == [5]
    assert cpus.parse_cpulist("") == []
    assert cpus.format_cpulist([11, 0, 1, 2, 3, 8, 10, 3]) == "0-3,8,10-11"
    assert cpus.format_cpulist([]) == ""


def test_blocks_keep_hyperthreads_together_and_split_evenly():
    node = range(16)  # 8 physical cores, two threads each
    split = cpus.blocks(4, node, hyperthreads(8))
    assert split == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    uneven = cpus.blocks(3, node, hyperthreads(8))
    assert [len(b) for b in uneven] == [4, 6, 6]
    assert sorted(c for b in uneven for c in b) == list(node), "every CPU in exactly one block"


def test_blocks_with_few_cpus():
    assert cpus.blocks(4, range(4), hyperthreads(2)) == [[0], [2], [1], [3]], "by logical CPU"
    assert cpus.blocks(3, [0, 1], lambda c: [c]) == [[0], [1], [0]], "shared when nothing else exists"
    with pytest.raises(ValueError):
        cpus.blocks(0, range(4))
    with pytest.raises(ValueError):
        cpus.blocks(2, [])


def test_gpu_jobs_on_disjoint_gpus_get_disjoint_cores():
    node = range(64)
    low = cpus.rank_cpus("cuda", [0, 1], 2, 4, node, hyperthreads(32))
    high = cpus.rank_cpus("cuda", [2, 3], 2, 4, node, hyperthreads(32))
    assert not {c for b in low for c in b} & {c for b in high for c in b}
    swapped = cpus.rank_cpus("cuda", [1, 0], 2, 4, node, hyperthreads(32))
    assert low[1] == swapped[0], "a GPU's block is its own"
    assert cpus.union(low) == ",".join(str(c) for c in [*range(16), *range(32, 48)])
    with pytest.raises(ValueError):
        cpus.rank_cpus("cuda", [3, 4], 2, 4, node)
    assert cpus.union(()) == ""


def test_a_forged_cpu_report_is_no_report():
    """A rank's status file is written inside the sandbox: the host takes only a list of CPU numbers."""
    from pkb_mcp.launches import _cpu_list

    assert _cpu_list([0, 5]) == [0, 5]
    for forged in ("0-3", [1, "2"], [True], [-1], {"0": 1}, None, [0] * (1 << 15)):
        assert _cpu_list(forged) == []


def test_a_forged_stage_report_is_no_report():
    """Seconds per stage come from the same status file: only a short map of names to times counts."""
    from pkb_mcp.launches import RankOutcome, _stage_times, longest_stages

    assert _stage_times({"import": 0.5, "trials": 2}) == {"import": 0.5, "trials": 2.0}
    for forged in (
        [("import", 1.0)],
        {"import": -1.0},
        {"import": float("nan")},
        {"import": True},
        {"import": "1"},
        {1: 1.0},
        {"x" * 41: 1.0},
        {str(i): 1.0 for i in range(17)},
    ):
        assert _stage_times(forged) == {}
    ranks = [
        RankOutcome(0, "ok", stages={"import": 0.5, "trials": 2.0}),
        RankOutcome(1, "ok", stages={"import": 0.75}),
    ]
    assert longest_stages(ranks) == {"import": 0.75, "trials": 2.0}


def test_pin_setting(monkeypatch):
    monkeypatch.delenv("PKB_PIN_CPUS", raising=False)
    assert config.pin_cpus("cuda") and not config.pin_cpus("cpu")
    monkeypatch.setenv("PKB_PIN_CPUS", "1")
    assert config.pin_cpus("cpu")
    monkeypatch.setenv("PKB_PIN_CPUS", "0")
    assert not config.pin_cpus("cuda")
    assert warm_key("cpu", [], 2, 1).cpus == ()
    monkeypatch.setenv("PKB_PIN_CPUS", "yes")
    with pytest.raises(ValueError, match="PKB_PIN_CPUS"):
        config.pin_cpus("cpu")


# A correct all-reduce that first reports the CPUs its rank's threads may use, then tries to widen
# its own affinity to every CPU and reports what it got.
REPORTER = """
import os
import torch.distributed as dist


def solution(x):
    threads = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            threads |= os.sched_getaffinity(int(tid))
        except OSError:
            pass
    try:
        os.sched_setaffinity(0, range(os.cpu_count()))
    except OSError:
        pass
    widened = sorted(os.sched_getaffinity(0))
    print(f"PKB-CPUS rank={dist.get_rank()} threads={sorted(threads)} widened={widened}", flush=True)
    out = x.clone()
    dist.all_reduce(out)
    return out
"""


def reported(outcome):
    """rank -> (CPUs of all its threads, affinity after trying to widen it), from the rank logs."""
    found = {}
    for r in outcome.ranks:
        m = re.search(r"PKB-CPUS rank=(\d+) threads=\[([\d, ]*)\] widened=\[([\d, ]*)\]", r.log_tail)
        assert m, f"rank {r.rank} reported nothing: {r.log_tail[-500:]}"
        found[int(m[1])] = (
            tuple(cpus.parse_cpulist(m[2].replace(" ", ""))),
            set(cpus.parse_cpulist(m[3].replace(" ", ""))),
        )
    return found


@pytest.mark.integration
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin ranks apart")
def test_every_thread_of_each_rank_keeps_to_its_block_cold_and_warm(isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_PIN_CPUS", "1")
    solution = tmp_path / "reporter.py"
    solution.write_text(REPORTER)
    expected = cpus.rank_cpus("cpu", [], 2, 0)
    assert expected[0] != expected[1]
    backend = ProcessBackend()
    pool = enable_warm_pool(backend)
    assert pool is not None
    try:
        cold = run_launch(cpu_launch(solution=solution), backend)
        assert cold.ok and not cold.warm
        pool.settle()
        warm = run_launch(cpu_launch(solution=solution), backend)
        assert warm.ok and warm.warm, "the warm sandbox was started with the same cores"
    finally:
        pool.close()
    for outcome in (cold, warm):
        found = reported(outcome)
        assert {r: t for r, (t, _) in found.items()} == {0: expected[0], 1: expected[1]}
        assert [tuple(r.cpus) for r in outcome.ranks] == list(expected), "as each rank saw them at start"
        assert all(list(r.stages) == ["setup", "import", "trials", "teardown"] for r in outcome.ranks)
        # without a container nothing stops a process from leaving its block: pinning here is
        # placement, not a boundary
        assert all(w == set(range(os.cpu_count() or 1)) for _, w in found.values())


@pytest.mark.integration
@pytest.mark.skipif(docker_client() is None, reason="no Docker engine answers")
def test_a_container_holds_its_ranks_to_the_jobs_cores(isolated_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_PIN_CPUS", "1")
    monkeypatch.setattr(cpus, "rank_cpus", lambda *a, **k: ((0,), (0,)))
    solution = tmp_path / "reporter.py"
    solution.write_text(REPORTER)
    outcome = run_launch(cpu_launch(solution=solution), select_backend("docker"))
    assert outcome.ok
    found = reported(outcome)
    assert found == {0: ((0,), {0}), 1: ((0,), {0})}, "the launch's cpuset is CPU 0 alone"
