"""The host/sandbox records of harness/contracts.py: its readers, and the records both sides build.

No sandbox and no ranks: the launcher's and the worker's pieces are called directly.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from harness import contracts, launch, worker
from harness.contracts import ContractError, LaunchConfig, RankRecord
from pkb_mcp.runs.benchmark import CPU_TIMING, GPU_TIMING, launch_share
from sandbox.base import warm_setup


def launch_config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """A launch configuration as pkb_mcp/launches.py writes it."""
    cfg: dict[str, Any] = {
        "mode": "benchmark",
        "launch_dir": str(tmp_path),
        "problem_path": str(tmp_path / "src" / "problem_001_allreduce.py"),
        "solution_path": str(tmp_path / "src" / "solution.py"),
        "world_size": 2,
        "device": "cpu",
        "size": {"n": 4096},
        "dtype": "float32",
        "seeds": [12345, 67890],
        "tolerance": {"atol": 1e-5, "rtol": 1e-5, "outputs": {"0": {"atol": 1e-3}}},
        "timeout_s": 120,  # a whole number: JSON writes it without a point
        "timing": {**launch_share(CPU_TIMING, 2), "fresh_label": "launch0", "fresh_top_up": True},
        "threads_per_rank": 1,
        "convention": "auto",
        "rank_cpus": [[0], [1]],
    }
    cfg.update(changes)
    return cfg


def test_a_launch_configuration_round_trips(tmp_path: Path) -> None:
    cfg = launch_config(tmp_path)
    assert contracts.read_launch_config(json.loads(json.dumps(cfg))) == cfg
    assert contracts.read_launch_config(launch_config(tmp_path, timing=None))["timing"] is None


@pytest.mark.parametrize(
    "timing", [GPU_TIMING, CPU_TIMING, {"warmup_ms": 20.0, "max_warmup": 50, "calls": 3}]
)
def test_the_hosts_timing_configurations_are_read(tmp_path: Path, timing: Any) -> None:
    cfg = launch_config(tmp_path, timing=dict(timing))
    assert contracts.read_launch_config(json.loads(json.dumps(cfg)))["timing"] == timing


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seeds": None}, "needs 'seeds' to be a list, not null"),
        ({"world_size": "2"}, "needs 'world_size' to be an integer, not a string"),
        ({"world_size": True}, "needs 'world_size' to be an integer, not true or false"),
        ({"world_size": 2.0}, "needs 'world_size' to be an integer, not a number"),
        ({"timeout_s": "120"}, "needs 'timeout_s' to be a number, not a string"),
        ({"seeds": [1, "2"]}, "needs 'seeds[1]' to be an integer, not a string"),
        ({"rank_cpus": [0, 1]}, "needs 'rank_cpus[0]' to be a list, not an integer"),
        ({"timing": "fast"}, "needs 'timing' to be an object or null, not a string"),
        ({"timing": {"warmup_ms": "20"}}, "needs 'timing.warmup_ms' to be a number, not a string"),
        ({"timing": {"warmup": 20}}, "has a key 'timing.warmup' that its contract does not define"),
        ({"seed": [1]}, "has a key 'seed' that its contract does not define"),
    ],
)
def test_a_mistyped_launch_configuration_fails_with_one_sentence(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    cfg = launch_config(tmp_path, **changes)
    with pytest.raises(ContractError) as caught:
        contracts.read_launch_config(cfg)
    text = str(caught.value)
    assert text == f"the launch configuration {message} (harness/contracts.py LaunchConfig)"
    assert "\n" not in text


def test_a_nested_record_names_the_key_that_is_wrong(tmp_path: Path) -> None:
    """Inside a record that is not optional, the message points at the key itself."""
    data = {"mode": "build", "launch_dir": str(tmp_path), "timeout_s": 60, "commands": [{"argv": "nvcc"}]}
    with pytest.raises(ContractError, match=r"needs 'commands\[0\]\.argv' to be a list, not a string"):
        contracts.read_tool_config(data)
    with pytest.raises(ContractError, match=r"lacks the key 'commands\[0\]\.argv'"):
        contracts.read_tool_config({**data, "commands": [{"cwd": "x"}]})


@pytest.mark.parametrize("key", sorted(LaunchConfig.__required_keys__))
def test_a_launch_configuration_without_a_key_fails(tmp_path: Path, key: str) -> None:
    cfg = launch_config(tmp_path)
    del cfg[key]
    with pytest.raises(ContractError, match=rf"^the launch configuration lacks the key '{key}' "):
        contracts.read_launch_config(cfg)


def test_a_launch_configuration_that_is_no_object_fails() -> None:
    with pytest.raises(ContractError, match=r"^the launch configuration must be a JSON object, not a list$"):
        contracts.read_launch_config([1, 2])


def test_the_launcher_hands_each_rank_a_set_up_and_a_rank_config(tmp_path: Path) -> None:
    """What harness.launch sends down each worker's stdin is what harness.worker reads."""
    cfg = contracts.read_launch_config(launch_config(tmp_path))
    for rank in range(cfg["world_size"]):
        setup_line = json.loads(json.dumps(launch.rank_setup(launch.setup_of(cfg), rank)))
        setup = contracts.read_rank_setup(setup_line)
        assert (setup["rank"], setup["world_size"], setup["setup_timeout_s"]) == (rank, 2, 120)
        rank_cfg = contracts.read_rank_config(json.loads(json.dumps({**cfg, "rank": rank})))
        assert rank_cfg["rank"] == rank and rank_cfg["seeds"] == cfg["seeds"]
    with pytest.raises(ContractError, match=r"^the rank's launch configuration lacks the key 'rank' "):
        contracts.read_rank_config(cfg)


def test_a_warm_sandbox_set_up_from_the_host_is_read_and_handed_on_without_its_own_keys(
    tmp_path: Path,
) -> None:
    setup = contracts.read_warm_setup(json.loads(json.dumps(warm_setup(tmp_path, 2, "cpu", 1, ((0,), (1,))))))
    assert setup["idle_s"] > 0
    line = launch.rank_setup(setup, 1)
    assert "idle_s" not in line and "gated" not in line
    assert contracts.read_rank_setup(line)["rank_cpus"] == [[0], [1]]
    gated = contracts.read_warm_setup(json.loads(json.dumps(warm_setup(tmp_path, 2, "cuda", 1, gated=True))))
    assert gated["gated"] is True
    assert contracts.read_rank_setup(launch.rank_setup(gated, 0))["gated"] is True


LAUNCHER_END = """
import io, json, os, subprocess, sys, time
from pathlib import Path
from harness import forking, launch

class Rank:  # a worker that ended ok at once; what it was sent is kept
    def __init__(self):
        self.stdin, self.returncode = io.BytesIO(), 0
        self.stdin.close = lambda: None
    def poll(self):
        return 0

forking.become_subreaper()  # as harness.launch's spawn does
# a process a rank's solution left behind: double-forked, so an orphan of the launcher
subprocess.Popen([sys.executable, "-c", "import os, time; os.fork() or time.sleep(60)"]).wait()
orphans = forking.children()
cfg = json.loads(sys.argv[1])
for rank in range(2):
    (Path(cfg["launch_dir"]) / f"rank{rank}.status.json").write_text('{"state": "ok"}')
procs = [Rank(), Rank()]
record = launch.launch(cfg, procs)
sent = [json.loads(p.stdin.getvalue()) for p in procs]
print(json.dumps({"record": record, "sent": sent, "orphans": orphans, "left": forking.children()}))
"""


def run_launcher_script(script: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """What `script` (a launcher with stand-in ranks, in a process of its own: the launcher kills its
    children) prints as JSON, given the launch configuration `cfg` as its argument."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg)], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("token", ["7a" * 16, None])
def test_the_launcher_keeps_the_end_token_from_its_ranks_and_writes_it_once_their_processes_are_gone(
    tmp_path: Path, token: str | None
) -> None:
    """The token is the launcher's alone (no rank is sent it) and goes into its record only after
    every process the ranks left is killed."""
    cfg = launch_config(tmp_path, mode="outputs")
    if token is not None:
        cfg["end_token"] = token
    seen = run_launcher_script(LAUNCHER_END, cfg)
    assert [r["state"] for r in seen["record"]["ranks"]] == ["ok", "ok"]
    assert seen["record"].get("end_token") == token
    assert all("end_token" not in s and s["rank"] == r for r, s in enumerate(seen["sent"]))
    assert len(seen["orphans"]) == 1 and seen["left"] == [], "the orphan is killed before the record"


def test_the_launcher_reads_its_config_file_once_and_refuses_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(json.dumps({"mode": "discover", "launch_dir": str(tmp_path), "timeout_s": 30}))
    assert launch.read_config(path)["mode"] == "discover" and not path.exists()
    path.write_text(json.dumps(launch_config(tmp_path, world_size="two")))
    with pytest.raises(SystemExit) as caught:
        launch.main(["--config-file", str(path)])
    assert str(caught.value) == (
        "harness.launch: the launch configuration needs 'world_size' to be an integer, not a string "
        "(harness/contracts.py LaunchConfig)"
    )
    assert not path.exists() and not (tmp_path / "launch.json").exists()


def _is_rank_record(record: object) -> bool:
    """Every key defined by RankRecord and well typed (the launcher's reader keeps all of them)."""
    assert isinstance(record, dict)
    return set(record) <= set(RankRecord.__annotations__) and contracts.read_rank_status(record) == record


def test_a_workers_status_records_are_rank_records() -> None:
    stages = worker.Stages()
    stages.enter("trials", "trial 0")
    finished = json.loads(json.dumps(worker.finished_status(time.monotonic(), [0, 1], stages)))
    assert _is_rank_record(finished) and finished["state"] == "ok"
    try:
        raise RuntimeError("the candidate failed")
    except RuntimeError as exc:
        failed = json.loads(json.dumps(worker.failed_status(exc, "trial 0", time.monotonic(), [0], stages)))
    assert _is_rank_record(failed)
    assert (failed["state"], failed["stage"], failed["error"]) == (
        "error",
        "trial 0",
        "RuntimeError: the candidate failed",
    )


def test_the_launcher_completes_a_rank_record_for_launch_json() -> None:
    stages = worker.Stages()
    failed = json.loads(
        json.dumps(worker.failed_status(ValueError("bad"), "import", time.monotonic(), [3], stages))
    )
    records = [
        launch.rank_record(
            0, 0, 1.23456, {"state": "ok", "cpus": [0], "stages": {"trials": 0.5}}, False, False
        ),
        launch.rank_record(1, 3, 0.5, contracts.read_rank_status(failed), False, False),
        launch.rank_record(2, -signal.SIGKILL, 9.0, {}, True, True),
        launch.rank_record(3, -signal.SIGSEGV, 0.1, {}, False, False),
        launch.rank_record(4, 0, 0.1, {}, False, False),
    ]
    assert [r["state"] for r in records] == ["ok", "error", "timeout", "crashed", "exited"]
    assert records[0]["elapsed_s"] == 1.235 and records[1]["error"] == "ValueError: bad"
    assert records[3]["signal"] == "SIGSEGV"
    assert all(_is_rank_record(json.loads(json.dumps(r))) for r in records)


def test_a_forged_status_keeps_only_its_well_typed_fields() -> None:
    """A status file is written where candidate code ran: the launcher drops what does not type-check."""
    forged = {"state": "ok", "cpus": "all", "stages": {"trials": "fast"}, "elapsed_s": True, "extra": 1}
    assert contracts.read_rank_status(forged) == {"state": "ok"}
    assert contracts.read_rank_status(["ok"]) == {}
    rank = launch.rank_record(0, 0, 1.0, contracts.read_rank_status(forged), False, False)
    assert (rank["state"], rank["cpus"], rank["stages"]) == ("ok", None, None)


def test_a_rank_the_launcher_signalled_at_its_deadline_timed_out_even_before_its_handler() -> None:
    """Issue 51: SIGUSR1 ends a rank still starting (its faulthandler is not registered yet); at the
    deadline that was reported as `crashed (SIGUSR1)`. A death by the launcher's own signals is its
    deadline (or its abort after a peer failed), and a rank never seen started says so."""
    usr1, kill = -signal.SIGUSR1, -signal.SIGKILL
    starting = launch.rank_record(0, usr1, 30.0, {}, True, False, signalled=True, started=False)
    assert (starting["state"], starting["signal"], starting.get("stage")) == (
        "timeout",
        "SIGUSR1",
        "starting",
    )
    assert starting["stage"] == contracts.STARTING
    running = launch.rank_record(1, kill, 30.0, {}, True, False, signalled=True, started=True)
    assert running["state"] == "timeout" and "stage" not in running
    after_peer = launch.rank_record(1, usr1, 5.0, {}, False, True, signalled=True, started=True)
    assert after_peer["state"] == "aborted"
    # a SIGUSR1 that did not come from the launcher is still a crash
    assert launch.rank_record(2, usr1, 1.0, {}, False, False)["state"] == "crashed"
    assert all(_is_rank_record(json.loads(json.dumps(r))) for r in (starting, running, after_peer))


def test_the_launcher_reports_a_deadline_before_the_ranks_started_as_such(tmp_path, monkeypatch) -> None:
    """A launch whose ranks never joined their process group by the deadline: every rank is a
    timeout whose stage is `starting` (here the ranks are stand-in processes that only sleep)."""
    import subprocess
    import sys

    monkeypatch.setattr(launch, "STACK_DUMP_WAIT_S", 0.05)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    (tmp_path / "rank1.ready").write_text("{}")  # rank 1 got past its start; rank 0 did not
    monkeypatch.setattr(launch, "_send", lambda proc, message, close: None)
    cfg = {"launch_dir": str(tmp_path), "world_size": 2, "timeout_s": 0.3}
    record = launch.launch(cfg, procs)  # type: ignore[arg-type]
    assert record["timed_out"]
    states = [(r["state"], r.get("stage")) for r in record["ranks"]]
    assert states == [("timeout", contracts.STARTING), ("timeout", None)], record
