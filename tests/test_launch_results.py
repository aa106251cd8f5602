"""What the host reads back from a launch (pkb_mcp/launches.py): everything in a launch directory is
written inside the sandbox, so each file is read with a size cap and taken apart without trusting it.

A stand-in backend writes what a hostile or broken launcher could leave; no sandbox, no ranks."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from harness import tensorfile
from pkb_mcp import launches
from pkb_mcp.errors import Cancelled
from pkb_mcp.launches import RANK_LOG_CAP, ToolLaunches, read_result, run_launch
from pkb_mcp.runs.run import NOT_STARTED, rank_result
from sandbox.backend import Backend
from sandbox.base import SandboxLaunch, SandboxRun

from .conftest import cpu_launch


class ScriptedBackend(Backend):
    """A backend whose 'launch' writes the given files into the launch directory and ends as told."""

    name = "scripted"
    isolated = False
    note = "test stand-in"

    def __init__(self, files: dict[str, bytes | str] | None = None, **run: object) -> None:
        self.files = files or {}
        self.run_fields = {"exit_code": 0, "wall_s": 0.25, "killed_at_deadline": False, "launcher_log": ""}
        self.run_fields.update(run)
        self.seen: list[SandboxLaunch] = []

    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        self.seen.append(launch)
        for name, content in self.files.items():
            path = launch.launch_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        return SandboxRun(**self.run_fields)  # type: ignore[arg-type]


def ranks_record(*entries: dict, **more: object) -> str:
    return json.dumps({"ranks": list(entries), **more})


# ---------------------------------------------------------------- read_result


def test_read_result_reads_json_and_refuses_what_it_cannot_trust(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2]}')
    assert read_result(good) == {"a": [1, 2]}
    assert read_result(tmp_path / "missing.json") is None
    big = tmp_path / "big.json"
    big.write_text(json.dumps("x" * 100))
    assert read_result(big, cap=50) is None
    assert read_result(big, cap=200) == "x" * 100
    broken = tmp_path / "broken.json"
    broken.write_text('{"a": ')
    assert read_result(broken) is None
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert read_result(binary) is None
    link = tmp_path / "link.json"
    link.symlink_to(good)
    assert read_result(link) is None, "a link made in the sandbox could point anywhere on the host"
    assert read_result(tmp_path) is None, "a directory is not a result"


# ---------------------------------------------------------------- ended_cleanly


def ok_rank(rank: int) -> dict:
    return {"rank": rank, "state": "ok", "exit_code": 0}


TOKEN = "5e" * 16


@pytest.mark.parametrize(
    ("record", "clean"),
    [
        (ranks_record(ok_rank(0), ok_rank(1), end_token=TOKEN), True),
        (None, False),  # not written yet
        (ranks_record(ok_rank(0), ok_rank(1)), False),  # forged: a candidate does not know the token
        (ranks_record(ok_rank(0), ok_rank(1), end_token="00" * 16), False),
        (ranks_record(ok_rank(0), ok_rank(1), end_token=7), False),
        (ranks_record(ok_rank(0), {"rank": 1, "state": "error", "exit_code": 1}, end_token=TOKEN), False),
        (ranks_record(ok_rank(0), {"rank": 1, "state": "ok", "exit_code": -9}, end_token=TOKEN), False),
        (ranks_record(ok_rank(0), {"rank": 1, "state": "ok"}, end_token=TOKEN), False),
        (ranks_record(end_token=TOKEN), False),
        ('{"ranks": ', False),  # half a file
        (json.dumps({"ranks": "ok", "end_token": TOKEN}), False),
        (json.dumps([ok_rank(0)]), False),
        (ranks_record(ok_rank(0), end_token=TOKEN, pad="x" * (launches.RECORD_CAP + 1)), False),
    ],
)
def test_a_launch_ended_cleanly_only_with_its_token_and_every_rank_ok(tmp_path, record, clean):
    """What lets a backend return before its sandbox's own end: read like every file a launch wrote."""
    if record is not None:
        (tmp_path / "launch.json").write_text(record)
    assert launches.ended_cleanly(tmp_path, TOKEN) is clean


def test_a_link_is_no_clean_end(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(ranks_record(ok_rank(0), end_token=TOKEN))
    (tmp_path / "launch.json").symlink_to(target)
    assert not launches.ended_cleanly(tmp_path, TOKEN)


def test_only_a_check_s_launch_may_end_before_its_sandbox_and_each_has_its_own_token():
    """A benchmark's or a profile's next launch is timed: the engine's teardown must not run beside
    it. A backend that always waits for its sandbox's end is given no token."""
    tokens = []
    for mode, ends_early, early in (
        ("outputs", True, True),
        ("outputs", True, True),
        ("benchmark", True, False),
        ("profile", True, False),
        ("outputs", False, False),
    ):
        backend = ScriptedBackend()
        backend.ends_early = ends_early  # type: ignore[attr-defined]
        run_launch(cpu_launch(mode=mode), backend)
        launch = backend.seen[0]
        assert (launch.ended is not None) is early and ("end_token" in launch.config) is early, mode
        if early:
            tokens.append(launch.config["end_token"])
            assert launch.ended(launch.launch_dir) is False, "no record yet"
    assert len(tokens) == 2 and tokens[0] != tokens[1] and all(len(t) == 32 for t in tokens)


# ---------------------------------------------------------------- run_launch


def test_a_launcher_that_never_reported_loses_every_rank():
    crashed = run_launch(cpu_launch(world_size=3), ScriptedBackend())
    assert [(r.rank, r.state) for r in crashed.ranks] == [(0, "crashed"), (1, "crashed"), (2, "crashed")]
    assert not crashed.ok and not crashed.timed_out
    killed = run_launch(cpu_launch(), ScriptedBackend(killed_at_deadline=True))
    assert [r.state for r in killed.ranks] == ["timeout", "timeout"] and killed.timed_out
    # killed with no record: its launcher never reached its own deadline, so the ranks never started
    assert {r.stage for r in killed.ranks} == {"starting"}
    assert rank_result(killed.ranks[0]).message == NOT_STARTED
    malformed = run_launch(cpu_launch(), ScriptedBackend({"launch.json": '{"ranks": [{"rank": 0'}))
    assert [r.state for r in malformed.ranks] == ["crashed", "crashed"]
    no_ranks = run_launch(cpu_launch(), ScriptedBackend({"launch.json": '{"timed_out": false}'}))
    assert [r.state for r in no_ranks.ranks] == ["crashed", "crashed"]


def test_rank_entries_are_cut_to_the_world_size_and_their_fields_coerced():
    forged = ranks_record(
        {"rank": 0, "state": "ok", "cpus": "0-3", "stages": {"import": -1}, "elapsed_s": 0.5},
        {"rank": 1, "state": "error", "error": ["not", "a", "string"], "stage": 7, "cpus": [2, 3]},
        {"rank": 2, "state": "ok"},
        timed_out=True,
    )
    outcome = run_launch(cpu_launch(world_size=2), ScriptedBackend({"launch.json": forged}))
    assert [r.rank for r in outcome.ranks] == [0, 1], "ranks beyond the world size are ignored"
    first, second = outcome.ranks
    assert first.cpus == [] and first.stages == {} and first.ended_s == 0.5
    assert second.error == "['not', 'a', 'string']" and second.stage == "7" and second.cpus == [2, 3]
    assert outcome.timed_out and not outcome.ok


def test_rank_logs_and_the_launcher_log_are_read_to_their_caps():
    log = "x" * (3 * RANK_LOG_CAP) + "the end"
    outcome = run_launch(
        cpu_launch(),
        ScriptedBackend(
            {
                "launch.json": ranks_record({"rank": 0, "state": "ok"}, {"rank": 1, "state": "ok"}),
                "rank1.log": log,
            },
            launcher_log="L" * 10_000 + "last",
        ),
    )
    assert outcome.ok
    assert outcome.ranks[0].log_tail == "", "a missing log is an empty one"
    assert len(outcome.ranks[1].log_tail) == RANK_LOG_CAP and outcome.ranks[1].log_tail.endswith("the end")
    assert len(outcome.launcher_log) == 4000 and outcome.launcher_log.endswith("last")


def tensor_file(tmp_path: Path, name: str, value: torch.Tensor) -> bytes:
    path = tmp_path / name
    tensorfile.save(path, [value])
    return path.read_bytes()


def test_only_this_modes_output_files_count_and_broken_ones_are_errors(tmp_path):
    ok = ranks_record({"rank": 0, "state": "ok"}, {"rank": 1, "state": "ok"})
    value = torch.arange(6, dtype=torch.float32)
    good = tensor_file(tmp_path, "good.pkbt", value)
    files = {
        "launch.json": ok,
        "out/t0_r0.pkbt": good,
        "out/t0_r1.pkbt": b"not a tensor file",
        "out/s0_r0.pkbt": good,  # a benchmark's input set: not a trial's output
        "out/t0_r0.pkbt.bak": good,
        "out/notes.txt": b"ignored",
    }
    outcome = run_launch(cpu_launch(), ScriptedBackend(files))
    assert set(outcome.outputs) == {(0, 0)} and torch.equal(outcome.outputs[(0, 0)].tensors[0], value)
    assert set(outcome.output_errors) == {(0, 1)} and outcome.output_errors[(0, 1)]
    assert outcome.fresh_outputs == {} and outcome.fresh_output_errors == {}

    bench = run_launch(cpu_launch(mode="benchmark"), ScriptedBackend({**files, "out/f3_r1.pkbt": good}))
    assert set(bench.outputs) == {(0, 0)}, "set 0's output, not trial 0's"
    assert set(bench.fresh_outputs) == {(3, 1)} and bench.output_errors == {}


def test_timing_and_convention_records_are_taken_only_when_well_formed():
    ok = ranks_record({"rank": 0, "state": "ok"}, {"rank": 1, "state": "ok"})
    broken = run_launch(cpu_launch(), ScriptedBackend({"launch.json": ok, "timing.json": "{not json"}))
    assert broken.timing is None and broken.convention is None
    for not_a_record in ("[1, 2]", "\xff\xfe", '"text"'):
        odd = run_launch(cpu_launch(), ScriptedBackend({"launch.json": ok, "timing.json": not_a_record}))
        assert odd.timing is None, not_a_record
    timing = {"device_ms": [1.0, 2.0], "warmup_calls": 3}
    convention = {"requested": "auto", "used": "original", "why": "w" * 1000, "extra": "dropped", "x": 1}
    outcome = run_launch(
        cpu_launch(),
        ScriptedBackend(
            {"launch.json": ok, "timing.json": json.dumps(timing), "convention.json": json.dumps(convention)}
        ),
    )
    assert outcome.timing == timing
    assert outcome.convention == {"requested": "auto", "used": "original", "why": "w" * 300}
    not_strings = run_launch(
        cpu_launch(), ScriptedBackend({"launch.json": ok, "convention.json": '{"used": 1, "why": null}'})
    )
    assert not_strings.convention is None


def test_the_launch_sees_copies_of_its_files_and_its_directory_is_removed(isolated_dirs):
    backend = ScriptedBackend(
        {"launch.json": ranks_record({"rank": 0, "state": "ok"}, {"rank": 1, "state": "ok"})}
    )
    request = cpu_launch()
    seen: list[list[str]] = []
    outcome = run_launch(request, backend, collect=lambda d: seen.append(sorted(os.listdir(d))) or "read")
    (launch,) = backend.seen
    problem_copy = Path(launch.config["problem_path"])
    assert problem_copy.parent == launch.launch_dir / "src" and problem_copy != request.problem_path
    assert launch.config["solution_path"] == launch.config["problem_path"], (
        "the reference as its own candidate"
    )
    assert launch.config["world_size"] == 2 and launch.config["seeds"] == request.settings["seeds"]
    assert outcome.collected == "read" and "launch.json" in seen[0]
    assert not launch.launch_dir.exists() and list(isolated_dirs.iterdir()) == []


def test_cancelled_launches_raise_and_leave_nothing(isolated_dirs):
    cancel = threading.Event()
    cancel.set()
    backend = ScriptedBackend()
    with pytest.raises(Cancelled, match="before it started"):
        run_launch(cpu_launch(), backend, cancel=cancel)
    assert backend.seen == []
    with pytest.raises(Cancelled, match="every process of the launch was killed"):
        run_launch(cpu_launch(), ScriptedBackend(cancelled=True))
    assert list(isolated_dirs.iterdir()) == []


def test_longest_stages_takes_each_stages_slowest_rank():
    ranks = [
        launches.RankOutcome(0, "ok", stages={"import": 1.0, "trials": 3.0}),
        launches.RankOutcome(1, "ok", stages={"import": 2.0}),
        launches.RankOutcome(2, "ok"),
    ]
    assert launches.longest_stages(ranks) == {"import": 2.0, "trials": 3.0}
    assert launches.longest_stages([]) == {}


# ---------------------------------------------------------------- tool launches


def test_a_tool_launch_reports_its_exit_code_only_when_it_is_an_integer(isolated_dirs):
    tools = ToolLaunches(
        ScriptedBackend({"launch.json": '{"exit_code": 3}', "build.log": "compiler said no"})
    )
    launch_dir = tools.new_dir()
    outcome = tools.run("build", launch_dir, {"extensions": []}, 30.0)
    assert outcome.exit_code == 3 and not outcome.timed_out and outcome.log == "compiler said no"
    assert launch_dir.exists(), "the caller reads the tool's result, then removes the directory"

    forged = ToolLaunches(ScriptedBackend({"launch.json": '{"exit_code": "0"}'}, launcher_log="launcher"))
    outcome = forged.run("build", forged.new_dir(), {}, 30.0)
    assert outcome.exit_code is None and outcome.log == "launcher"


def test_a_discovery_that_never_reported_timed_out():
    tools = ToolLaunches(ScriptedBackend({"launch.json": "[1, 2"}))
    assert tools.run("discover", tools.new_dir(), {}, 30.0).timed_out
    killed = ToolLaunches(ScriptedBackend({"launch.json": '{"exit_code": 0}'}, killed_at_deadline=True))
    assert killed.run("build", killed.new_dir(), {}, 30.0).timed_out


def test_a_tool_launch_runs_on_cpu_with_its_parameters_in_the_config():
    backend = ScriptedBackend({"launch.json": '{"exit_code": 0}'})
    tools = ToolLaunches(backend)
    launch_dir = tools.new_dir()
    tools.run("build", launch_dir, {"extensions": ["e"]}, 12.0)
    (launch,) = backend.seen
    assert launch.device == "cpu" and launch.gpus == [] and launch.timeout_s == 12.0
    assert launch.config["mode"] == "build" and launch.config["extensions"] == ["e"]
    assert launch.config["launch_dir"] == str(launch_dir)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        ToolLaunches(backend, cancel).run("build", launch_dir, {}, 1.0)


class SparseBackend(ScriptedBackend):
    """Writes its files, then extends some of them with holes to the given sizes (free on disk)."""

    def __init__(self, files: dict[str, bytes | str], grow: dict[str, int]) -> None:
        super().__init__(files)
        self.grow = grow

    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        done = super().run(launch, cancel)
        for name, size in self.grow.items():
            os.truncate(launch.launch_dir / name, size)
        return done


def test_a_candidate_s_outputs_are_read_only_as_far_as_the_expected_outputs_go(tmp_path, monkeypatch):
    """Each expected file's header is compared with the reference's outputs before its data, a file
    larger than those outputs is refused from its size, an unexpected one is never opened, and the
    launch's byte budget is cut to the expected outputs (plus the records read after them)."""
    made: list = []

    class Recorded(launches.LaunchFiles):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(launches, "LaunchFiles", Recorded)
    ok = ranks_record({"rank": 0, "state": "ok"}, {"rank": 1, "state": "ok"})
    right = tensor_file(tmp_path, "right.pkbt", torch.ones(4))
    wrong = tensor_file(tmp_path, "wrong.pkbt", torch.ones(8))
    files = {
        "launch.json": ok,
        "out/t0_r0.pkbt": right,
        "out/t0_r1.pkbt": wrong,
        "out/t1_r0.pkbt": right,  # its data then grows past what the expected outputs take
        "out/t7_r0.pkbt": right,  # no trial of this launch
    }
    expected = {
        f"t{t}_r{r}.pkbt": tensorfile.Expected.of("tuple", [torch.ones(4)]) for t in (0, 1) for r in (0, 1)
    }
    request = cpu_launch(seeds=[1, 2])
    request.expected = lambda: expected
    outcome = run_launch(request, SparseBackend(files, {"out/t1_r0.pkbt": 1 << 30}))
    assert set(outcome.outputs) == {(0, 0)} and torch.equal(outcome.outputs[(0, 0)].tensors[0], torch.ones(4))
    mismatch = outcome.output_errors[(0, 1)]
    assert (
        isinstance(mismatch, tensorfile.Mismatch)
        and mismatch == "output 0 is float32[8], expected float32[4]"
    )
    assert "more than outputs of the expected shapes take" in outcome.output_errors[(1, 0)]
    assert (7, 0) not in outcome.output_errors, "an unexpected file is not read"
    assert outcome.ok, "a wrong output is the candidate's verdict, not a refused launch"
    files_read = made[0]  # the collection's reader
    cap = sum(e.file_bytes for e in expected.values())
    assert files_read.budget <= cap + (66 << 20), "the launch's budget is the expected outputs'"
    assert files_read.read_bytes_total < 2 * len(right) + len(wrong) + (64 << 10), "headers, not data"


def test_the_verdict_of_a_refused_header_is_the_judge_s_and_a_benchmark_expects_the_reference_s_files():
    from pkb_mcp import problems
    from pkb_mcp.runs import judge, verdicts

    ref = launches.LaunchOutcome(ranks=[launches.RankOutcome(0, "ok")], wall_s=0, timed_out=False)
    ref.outputs[(0, 0)] = launches.Outputs("tensor", [torch.ones(4)], {})
    cand = launches.LaunchOutcome(ranks=[launches.RankOutcome(0, "ok")], wall_s=0, timed_out=False)
    cand.output_errors[(0, 0)] = tensorfile.Mismatch("output 0 is float32[8], expected float32[4]")
    (rank,) = verdicts.judge_ranks(problems.resolve(1), 1, [0], cand, ref)
    assert rank.state == "wrong" and rank.message == "output 0 is float32[8], expected float32[4]"

    ref.fresh_outputs[(3, 0)] = launches.Outputs("tuple", [torch.ones(2), torch.zeros(3)], {})
    bench = judge.expecting(cpu_launch(mode="benchmark", world_size=1), ref)
    assert bench.expected is not None
    files = bench.expected()
    assert files is not None and sorted(files) == ["f3_r0.pkbt", "s0_r0.pkbt"]
    assert bench.read_budget == judge.read_budget(files, 1) < 100 << 20, "relative to the expected outputs"
    check = judge.expecting(cpu_launch(seeds=[5], world_size=1), ref)
    assert check.expected is not None and list(check.expected() or {}) == ["t0_r0.pkbt"]
    failed = launches.LaunchOutcome(ranks=[launches.RankOutcome(0, "error")], wall_s=0, timed_out=False)
    assert judge.expecting(cpu_launch(), failed).expected is None, "no reference, no expectation"
