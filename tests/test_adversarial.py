"""Honest under attack: every reward hack in tests/adversarial/ fails the way it should, on CPU (gloo).

Each test names the hack, runs it through service.check or service.bench, and asserts the verdict,
each rank's state and the words of the message that say why. The process backend is used for speed,
except where the hack is about the sandbox itself (reading other launches' files, forging result
files): those also run in Docker when an engine answers. GPU-only hacks are in
tests/test_adversarial_gpu.py; docs/adversarial.md maps every hack to its defence and test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pkb_mcp import render, roofline, service
from pkb_mcp.models import BenchResult, RunRequest, SandboxInfo
from pkb_mcp.runs import benchmark, stats, verdicts

from .conftest import CANDIDATES, CEIL, docker_client, launch_processes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("small_docker_limits")]

ADV = Path(__file__).resolve().parent / "adversarial"
FORGED_MS = 0.000123  # the sample time every forging candidate writes

DOCKER = docker_client()
SANDBOXES = [
    "process",
    pytest.param("docker", marks=pytest.mark.skipif(DOCKER is None, reason="no Docker engine answers")),
]


def check(path: Path, *, pid: int = 1, world_size: int = 2, trials: int = 2, sandbox: str = "process", **kw):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=trials,
            timeout_s=120,
            sandbox=sandbox,
            **kw,
        )
    )


def bench(path: Path, *, pid: int = 1, world_size: int = 2, sandbox: str = "process"):
    return service.bench(
        RunRequest(
            problem=pid, path=path, world_size=world_size, device="cpu", timeout_s=180, sandbox=sandbox
        )
    )


def states(r) -> list[str]:
    return [x.state for x in r.ranks]


def assert_clean(launches_dir: Path) -> None:
    assert list(launches_dir.iterdir()) == [], "launch directories must be removed"
    assert launch_processes(launches_dir) == [], "no launch process may survive (forked ones included)"


# ---------------------------------------------------------------- cached and predicted outputs


@pytest.mark.parametrize("world_size", [2, 4])
def test_memoized_output_fails_the_second_trial(world_size, isolated_dirs):
    r = check(ADV / "memoized.py", world_size=world_size)
    assert r.verdict == "fail" and states(r) == ["wrong"] * world_size
    assert all(x.trial == 1 for x in r.ranks), "the first trial is right, the second stale"
    assert r.message.startswith("rank 0, trial 1:") and "elements differ" in r.message
    assert r.static_report is not None and any("_memo" in s for s in r.static_report.suspicious)
    assert_clean(isolated_dirs)


def test_memoized_output_fails_the_second_input_set_of_bench(isolated_dirs):
    r = bench(ADV / "memoized.py")
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"] and r.speedup is None
    assert "trial 1" in r.message and "elements differ" in r.message  # input set 1 is judged like a trial


def test_output_cached_by_data_pointer_goes_stale_when_inputs_rotate(isolated_dirs):
    """Right on every judged call; timed calls hit the cache. The harness moves other data into the
    same buffers between rounds, so the cached answers no longer match."""
    r = bench(ADV / "cached_by_pointer.py")
    assert r.verdict == "fail" and r.speedup is None, r.message
    assert states(r) == ["pass", "pass"], "every judged first call was right"
    assert "a timed call's output" in r.message and "cached by buffer address" in r.message
    assert any("caches by data pointer" in s for s in r.static_report.suspicious)
    assert_clean(isolated_dirs)


def test_outputs_memoized_by_input_values_are_not_credited(isolated_dirs):
    """Issue 17: a cache keyed on a few input values is always right (a miss computes), survives the
    buffer rotation, and hit on every replayed timed call: `pkb bench 1` credited 13.1x. Timed calls
    on fresh input sets miss; the side much faster on inputs it has seen is named, not credited."""
    r = bench(ADV / "memoized_by_values.py")
    assert r.verdict == "suspect" and r.faster_on_seen_inputs, r.message
    assert states(r) == ["pass", "pass"], "every judged output, fresh ones included, was right"
    assert (
        r.message.startswith("not credited: the candidate is")
        and "faster on input sets it has seen" in r.message
    )
    assert r.seen_inputs_advantage > 3 and r.candidate.replay_advantage_p < stats.REPLAY_P
    assert r.candidate.fresh_calls >= benchmark.CPU_TIMING["fresh_min"]
    assert r.speedup > 3 and r.fresh_speedup < r.speedup, "its figures are shown, fresh ones far lower"
    assert "SUSPECT: not credited" in render.bench(r)
    assert any("_cache" in s for s in r.static_report.suspicious)
    assert_clean(isolated_dirs)


def test_lazy_on_inputs_it_will_not_see_again_fails_on_a_fresh_set(isolated_dirs):
    """Right on the first eight inputs (every judged trial and replayed set), zeros afterwards: the
    fresh timed calls are judged too."""
    c = check(ADV / "lazy_on_new_inputs.py", trials=5)
    assert c.verdict == "pass", "five trials are among the first eight inputs"
    r = bench(ADV / "lazy_on_new_inputs.py")
    assert r.verdict == "fail" and r.speedup is None and states(r) == ["wrong", "wrong"], r.message
    assert r.message.startswith("wrong on a fresh input set") and "elements differ" in r.message


@pytest.mark.parametrize("candidate", ["reference", "caches_state.py"])
def test_honest_state_kept_across_calls_is_not_flagged(candidate, isolated_dirs):
    """The control: the reference, and a solution that keeps a process group and a buffer across
    calls, run as fast on fresh input sets as on replayed ones."""
    path = service.problems.resolve(1).path if candidate == "reference" else CANDIDATES / candidate
    r = bench(path)
    assert r.verdict == "pass" and not r.faster_on_seen_inputs, r.message
    assert r.candidate.fresh_calls >= benchmark.CPU_TIMING["fresh_min"] and r.fresh_speedup is not None


@pytest.mark.parametrize("world_size", [2, 4])
def test_predicted_output_fails_on_random_inputs(world_size, isolated_dirs):
    r = check(ADV / "predicts_output.py", world_size=world_size, trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong"] * world_size
    assert "elements differ" in r.message
    assert r.static_report.collectives == [], "the static report shows it never communicates"


def test_correct_once_then_wrong_fails_the_second_trial(isolated_dirs):
    r = check(ADV / "correct_once_then_wrong.py")
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert r.message.startswith("rank 0, trial 1:")


def test_correct_only_on_judged_calls_is_caught_by_timed_rechecks(isolated_dirs):
    r = bench(ADV / "correct_first_per_input.py")
    assert r.verdict == "fail" and r.speedup is None
    assert states(r) == ["pass", "pass"], "the judged first call of every input set was right"
    assert "a timed call's output" in r.message and "right on every call" in r.message


# ---------------------------------------------------------------- work after return, aliases, mutation


def test_work_finished_on_a_side_thread_is_judged_at_return(isolated_dirs):
    r = check(ADV / "side_thread.py", trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert r.ranks[0].first_mismatch is not None and r.ranks[0].first_mismatch.got == "0"
    assert any("threads" in s for s in r.static_report.suspicious)
    assert_clean(isolated_dirs)


def test_a_lazy_tensor_subclass_fails_at_return_in_check_and_bench(isolated_dirs):
    """Its all-reduce waited for the harness's first touch, after the clock: credited 65.8x. Outputs
    are taken plain at return, inside the call, so the subclass fails the rank there."""
    words = "output 0 is a LazyTensor, a subclass of torch.Tensor; return plain tensors"
    c = check(ADV / "lazy_tensor.py", trials=1)
    assert c.verdict == "fail" and states(c) == ["error", "error"], c.message
    assert words in c.message and "trial 0" in c.message
    r = bench(ADV / "lazy_tensor.py")
    assert r.verdict == "fail" and r.speedup is None and states(r) == ["error", "error"], r.message
    assert words in r.message
    assert_clean(isolated_dirs)


def test_view_of_an_input_is_rejected_even_when_the_values_are_right(isolated_dirs):
    r = check(ADV / "returns_view.py", pid=3, trials=1)  # broadcast: the root's output equals its input
    assert r.verdict == "fail" and states(r) == ["wrong", "pass"]
    assert "rank 0" in r.message and "shares memory with an input" in r.message


def test_input_mutated_to_save_an_allocation_is_detected(isolated_dirs):
    r = check(ADV / "mutates_input.py", trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert "input 0 was changed by the solution" in r.message


@pytest.mark.parametrize("world_size", [2, 4])
def test_only_rank0_correct_fails_on_the_other_ranks(world_size, isolated_dirs):
    r = check(ADV / "only_rank0_correct.py", world_size=world_size, trials=1)
    assert r.verdict == "fail" and states(r) == ["pass"] + ["wrong"] * (world_size - 1)
    assert r.message.startswith("rank 1, trial 0:")


# ---------------------------------------------------------------- loose-tolerance exploits


def test_fp8_communication_is_beyond_the_tolerance(isolated_dirs):
    r = check(ADV / "low_precision_fp8.py", trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert "elements differ" in r.message and r.ranks[0].mismatched > 1000


def test_zeros_where_small_fail_the_relative_norm(isolated_dirs):
    r = check(ADV / "zeros_where_small.py", trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert r.ranks[0].mismatched == 0, "every zeroed element is inside the elementwise tolerance"
    assert "relative error norm" in r.message


def test_computing_half_the_output_fails_at_the_second_half(isolated_dirs):
    r = check(ADV / "computes_subset.py", trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"]
    assert r.ranks[0].first_mismatch.index[0] == 512  # the first row of the second half (1024 rows)


@pytest.mark.parametrize(
    ("pid", "candidate", "output"),
    [
        (19, "fp8_scales_off.py", 0),
        (21, "clip_coefficient_off.py", None),
        (22, "clip_ep_coefficient_off.py", None),
    ],
)
def test_an_error_in_a_small_output_is_not_hidden_by_a_large_one(pid, candidate, output, isolated_dirs):
    """Issue 17: each output on its own bounds. Wrong only in its small outputs (19: the scales 10%
    off; 21, 22: the clipped gradients 1.2% off behind the total norm), each candidate passed when
    one relative norm was taken over all outputs together. (Correct variants of the same problems
    pass: tests/test_end_to_end.py::test_every_correct_variant_passes.)"""
    r = check(ADV / candidate, pid=pid, trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"], r.message
    if output is not None:  # the scales are far outside their own elementwise bounds
        assert r.ranks[0].first_mismatch.output == output and "rtol 2e-06" in r.message
    else:  # the gradients: a share of elements beyond their own rtol, and 1.2% in norm (bound 0.007)
        assert r.ranks[0].first_mismatch.output >= 1 and "rtol 0.01)" in r.message, r.message
        # 1.2% by construction, give or take the rounding of the problem's dtype at random inputs
        # (0.0132 seen once in CI, 2026-11-27)
        assert 0.011 < r.ranks[0].rel_norm_error < 0.014, "the worst output's norm: a gradient's"


def test_problem_86_in_lower_precision_than_its_contract_fails(isolated_dirs):
    """bf16 GEMMs and a bf16 Gram all-reduce (half the bytes) are outside the float32 contract.
    (float64, and gathering the momentum once with the Gram on the other side, pass:
    tests/test_end_to_end.py::test_every_correct_variant_passes.)"""
    r = check(ADV / "muon_low_precision.py", pid=86, trials=1)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"], r.message


# ---------------------------------------------------------------- patching the harness


@pytest.mark.parametrize(
    ("candidate", "replaced"),
    [
        ("patches_perf_counter.py", "time.perf_counter"),
        ("patches_harness_timing.py", "harness.timing.outputs_match"),
        ("patches_tensorfile.py", "harness.tensorfile.save"),
        ("patches_barrier.py", "torch.distributed.barrier"),
        ("patches_cuda_timers.py", "torch.cuda."),
    ],
)
def test_patching_clocks_torch_or_the_harness_fails_the_rank(candidate, replaced, isolated_dirs):
    r = check(ADV / candidate, trials=1)
    assert r.verdict == "fail" and states(r) == ["error", "error"], r.message
    assert f"the solution replaced {replaced}" in r.message and "not allowed" in r.message
    assert any("monkeypatches" in s for s in r.static_report.suspicious)


def test_a_patched_clock_never_reaches_a_speedup(isolated_dirs):
    r = bench(ADV / "patches_perf_counter.py")
    assert r.verdict == "fail" and r.speedup is None and r.candidate is None
    assert states(r) == ["error", "error"] and "replaced time.perf_counter" in r.message


# ---------------------------------------------------------------- the sandbox: other launches' files, forgery


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_reference_outputs_of_the_same_check_are_out_of_reach(sandbox, isolated_dirs):
    """Before: the process backend ran the reference's launch next to the candidate's, and copying its
    output files passed. Now the reference's launch is over (its directory gone) before the candidate
    starts; in Docker nothing outside /launch is visible at all."""
    r = check(ADV / "reads_reference.py", trials=1, sandbox=sandbox)
    assert r.verdict == "fail" and states(r) == ["error", "error"], r.message
    assert "no reference outputs found" in r.message and "visible: []" in r.message
    assert_clean(isolated_dirs)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_result_files_forged_during_calls_are_overwritten(sandbox, isolated_dirs):
    c = check(ADV / "forges_results.py", trials=2, sandbox=sandbox)
    assert c.verdict == "pass" and states(c) == ["pass", "pass"], c.message
    if sandbox == "process":  # one bench is enough to show the forged timing record is replaced
        b = bench(ADV / "forges_results.py", sandbox=sandbox)
        assert b.verdict == "pass" and b.candidate is not None, b.message
        assert b.candidate.median_ms != FORGED_MS and b.candidate.samples != 77
    assert_clean(isolated_dirs)


@pytest.mark.skipif(DOCKER is None, reason="no Docker engine answers")
def test_the_launcher_s_end_token_cannot_be_read_from_its_memory(isolated_dirs):
    """The Docker backend stops waiting at a launch record with the launcher's token (a check's launch
    that ended cleanly): a rank cannot read it from the launcher, so it cannot end its launch early."""
    c = check(ADV / "steals_end_token.py", trials=1, sandbox="docker")
    assert c.verdict == "pass", c.message
    said = " ".join(r.log_tail or "" for r in c.ranks)
    assert "the launcher's memory is closed: PermissionError" in said and "stole" not in said, said
    assert_clean(isolated_dirs)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_result_files_rewritten_after_the_harness_wrote_them_are_rejected(sandbox, isolated_dirs):
    """A thread and a double-forked process rewrite the output files without the aliasing and
    mutation flags: the files' keyed digests no longer match (or, had the rewrite come too late, the
    aliasing shows; or, killed with the launch in the middle of a rewrite, it left a file that is no
    tensor file at all). Its forked process must not outlive the launch."""
    r = check(ADV / "forges_after_return.py", trials=2, sandbox=sandbox)
    assert r.verdict == "fail" and states(r) == ["wrong", "wrong"], r.message
    # (a rewrite cut short leaves a file that is no tensor file, or one whose data stops early)
    caught = ("altered after the harness wrote it", "shares memory", "is not a tensor file", "past the end")
    assert any(why in r.message for why in caught), r.message
    assert_clean(isolated_dirs)


def test_a_timing_record_rewritten_after_the_harness_wrote_it_is_never_used(tmp_path, isolated_dirs):
    timing_only = tmp_path / "forges_timing.py"
    source = (ADV / "forges_after_return.py").read_text()
    timing_only.write_text(source.replace("RETURN_INPUT = True", "RETURN_INPUT = False"))
    r = bench(timing_only)
    if r.verdict == "fail":  # caught by its keyed digest, or cut off mid-write
        caught = ("timing record was altered", "no readable timing record")
        assert any(why in r.message for why in caught) and r.speedup is None, r.message
    else:  # the worker ended the forger's threads and processes before its last write
        assert r.verdict == "pass" and r.candidate.median_ms != FORGED_MS, r.message
    assert_clean(isolated_dirs)


# ---------------------------------------------------------------- ranks that leave or hang


def test_a_rank_that_exits_early_with_status_0_is_reported(isolated_dirs):
    r = check(CANDIDATES / "exits_early.py", trials=1)
    assert r.verdict == "fail" and r.ranks[1].state == "exited"
    assert "exited with status 0 before finishing" in r.message


def test_a_deadlock_is_killed_at_the_deadline(isolated_dirs):
    r = service.check(
        RunRequest(
            problem=1,
            path=CANDIDATES / "hangs.py",
            world_size=2,
            device="cpu",
            trials=1,
            timeout_s=12,
            sandbox="process",
        )
    )
    assert r.verdict == "timeout" and states(r) == ["timeout", "timeout"]
    assert "deadline" in r.message
    assert_clean(isolated_dirs)


# ---------------------------------------------------------------- multicast, refused before running


def test_multicast_is_refused_before_anything_runs(isolated_dirs):
    path = ADV / "gpu" / "uses_multicast.py"
    c = check(path)
    b = bench(path)
    for r in (c, b):
        assert r.verdict == "fail" and states(r) == ["error", "error"]
        assert r.message.startswith("refused: multicast is unavailable")
        assert "multimem_all_reduce_" in r.message
        assert r.static_report.multicast and r.wall_s < 10, "no launch was started"
    assert "multicast USED (refused)" in render.check(c)
    assert list(isolated_dirs.iterdir()) == []


# ---------------------------------------------------------------- the worker's defences, unit by unit


def test_input_rotation_moves_data_not_addresses():
    import torch

    from harness.benchmark import input_rotation as _input_rotation

    sets = [(torch.full((4,), float(i)), torch.tensor([i]), 7) for i in range(3)]
    addresses = [[t.data_ptr() for t in s[:2]] for s in sets]
    rotate = _input_rotation(sets)
    assert rotate is not None
    assert rotate() == [1, 2, 0]  # buffer 0 now holds set 1's data, ...
    assert [float(s[0][0]) for s in sets] == [1.0, 2.0, 0.0] and [int(s[1]) for s in sets] == [1, 2, 0]
    assert [[t.data_ptr() for t in s[:2]] for s in sets] == addresses
    assert rotate() == [2, 0, 1]
    differing = [(torch.zeros(2), 1), (torch.zeros(2), 2)]  # a non-tensor argument differs
    assert _input_rotation(differing) is None
    assert _input_rotation([(torch.zeros(2),), (torch.zeros(3),)]) is None  # shapes differ


def test_watch_names_what_was_replaced(monkeypatch):
    import time

    import torch

    from harness import timing
    from harness.worker import SolutionError, Watch

    watch = Watch()
    watch.check("unchanged")
    for owner, name, words in [
        (time, "perf_counter", "time.perf_counter"),
        (timing, "outputs_match", "harness.timing.outputs_match"),
        (timing.Timer, "time", "harness.timing.Timer.time"),
        (torch.Tensor, "clone", "torch.Tensor.clone"),
    ]:
        with monkeypatch.context() as m:
            m.setattr(owner, name, lambda *a, **k: None)
            with pytest.raises(SolutionError, match=re.escape(f"replaced {words} (a test)")):
                watch.check("a test")
    watch.check("restored")


# ---------------------------------------------------------------- speed of light


def test_speed_of_light_guard_flags_times_below_the_physical_floor():
    # 400 MB over NVLink at 400 GB/s: 1 ms; two rounds of assumed latency (0.01 ms) are not physics
    traffic = {"nvlink_bytes": 400e6, "hbm_bytes": 4e6, "flops": 1e6, "rounds": 2}
    roof = roofline.floor(1, "x", 4, "pkb", traffic, "bfloat16", limits=CEIL)
    assert verdicts.physical_floor_ms(roof) == pytest.approx(1.0)
    assert verdicts.below_floor(0.79, roof)
    assert not verdicts.below_floor(0.81, roof), "within the slack: a traffic model may round up"
    assert not verdicts.below_floor(1.005, roof), "under floor_ms (1.01) but above the physics"
    message = verdicts.floor_message(0.5, roof, 3.0)
    assert message.startswith("not credited") and "below the physical floor 1 ms" in message
    assert "NVLink" in message


def test_a_suspect_benchmark_renders_as_not_credited():
    traffic = {"nvlink_bytes": 400e6, "hbm_bytes": 4e6, "flops": 1e6, "rounds": 2}
    roof = roofline.floor(1, "allreduce", 4, "pkb", traffic, "bfloat16", time_ms=0.5, limits=CEIL)
    r = BenchResult(
        problem_id=1,
        problem="allreduce",
        world_size=4,
        size="pkb",
        device="cuda",
        verdict="suspect",
        message=verdicts.floor_message(0.5, roof, 3.0),
        speedup=3.0,
        speedup_low=2.9,
        speedup_high=3.1,
        roofline=roof,
        below_floor=True,
        wall_s=1.0,
        sandbox=SandboxInfo(backend="docker", isolated=True),
    )
    text = render.bench(r)
    assert "SUSPECT: not credited" in text and "rank" not in text.split("SUSPECT")[0]
    assert BenchResult.model_validate(r.model_dump()).below_floor
