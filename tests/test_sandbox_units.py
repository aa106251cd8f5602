"""The sandbox's parts that need no engine and run no launcher (sandbox/): log tails, the launch file,
the variables every launch gets, backend choice, the warm pool's bookkeeping, killing what a launch
left, and the container a Docker launch asks for (against a stand-in Docker client).
tests/test_sandbox_docker.py and tests/test_warm_pool.py run the real thing."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import sandbox.base
from sandbox import SandboxUnavailable, base, select_backend
from sandbox.pool import WarmKey, WarmPool

from .conftest import wait_for

# ---------------------------------------------------------------- base


def test_tail_reads_the_last_bytes_leniently(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_bytes(b"a" * 100 + "é".encode() + b"end")
    assert base.tail(log, 4) == "\ufffdend", "a character cut in half is replaced, not an error"
    assert base.tail(log, 1000).endswith("éend") and len(base.tail(log)) == 104
    assert base.tail(tmp_path / "missing.log") == ""
    log.write_bytes(b"x" * (2 * base.LOG_CAP_BYTES))
    assert len(base.tail(log)) == base.LOG_CAP_BYTES


def test_the_launch_file_appears_whole_and_private(tmp_path):
    launch_dir = tmp_path / "launch"
    launch_dir.mkdir()
    config = {"mode": "outputs", "seeds": [1, 2]}
    base.write_config(launch_dir, config)
    path = launch_dir / base.CONFIG_NAME
    assert json.loads(path.read_text()) == config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in launch_dir.iterdir()] == [base.CONFIG_NAME], "no partial file left"


def test_every_launch_keeps_multicast_off_and_a_warm_sandbox_knows_no_secret(tmp_path):
    assert base.LAUNCH_ENV["NCCL_NVLS_ENABLE"] == "0"
    assert base.LAUNCH_ENV["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert base.LAUNCH_ENV["NVSHMEM_DISABLE_NVLS"] == "1"
    assert base.LAUNCH_ENV["GLOO_SOCKET_IFNAME"] == "lo"  # no hostname to resolve, no warning per rank
    setup = base.warm_setup(tmp_path, 4, "cpu", 2, ((0, 1), (2, 3), (4,), (5,)))
    assert setup["launch_dir"] == str(tmp_path) and setup["world_size"] == 4
    assert setup["rank_cpus"] == [[0, 1], [2, 3], [4], [5]]
    assert not {"seeds", "solution_path", "problem_path", "mode"} & set(setup), "seeds come with the launch"


def test_backend_choice():
    with pytest.raises(
        SandboxUnavailable, match="unknown sandbox backend 'vm'; choose auto, docker or process"
    ):
        select_backend("vm")
    process = select_backend("process")
    assert process.name == "process" and not process.isolated and "without isolation" in process.note


# ---------------------------------------------------------------- the warm pool's bookkeeping


class Handles:
    """Stand-in sandboxes: each a number, ready at once, alive until marked dead; records what was
    discarded."""

    def __init__(self) -> None:
        self.dead: set[int] = set()
        self.discarded: list[int] = []
        self.count = 0

    def pool(self, launches: Path, per_key: int = 1, max_keys: int = 2) -> WarmPool:
        def start(slot: Any) -> int:
            slot.launch_dir.mkdir()
            for r in range(slot.key.world_size):
                (slot.launch_dir / f"rank{r}.ready").touch()  # as a warmed-up launcher's workers leave
            self.count += 1
            return self.count

        return WarmPool(
            new_dir=lambda launch_id: launches / launch_id,
            start=start,
            alive=lambda handle: handle not in self.dead,
            discard=lambda slot: self.discarded.append(slot.handle),
            per_key=per_key,
            max_keys=max_keys,
        )


CPU2 = WarmKey("cpu", (), 2, 1)
CPU4 = WarmKey("cpu", (), 4, 1)
GPU01 = WarmKey("cuda", (0, 1), 2, 1)


def test_a_warm_sandbox_serves_only_its_own_shape(isolated_dirs):
    handles = Handles()
    pool = handles.pool(isolated_dirs, per_key=2)
    pool.replenish(CPU2)
    pool.settle(timeout_s=5)
    assert pool.size() == 2
    assert pool.take(CPU4) is None and pool.take(WarmKey("cpu", (), 2, 2)) is None
    assert pool.take(WarmKey("cpu", (), 2, 1, ((0,), (1,)))) is None, "pinned cores are part of the shape"
    assert pool.take(CPU2) is not None and pool.size() == 1


def test_only_the_most_recently_used_shapes_stay_warm(isolated_dirs):
    handles = Handles()
    pool = handles.pool(isolated_dirs, per_key=1, max_keys=2)
    for key in (CPU2, CPU4, GPU01):
        pool.replenish(key)
        wait_for(lambda: not pool._starting, 5, "its start", poll_s=0.01)  # settle: not for GPU ones
    assert handles.discarded == [1], "the oldest shape's sandbox is stopped"
    assert pool.take(CPU2) is None and pool.take(CPU4) is not None and pool.take(GPU01) is not None


def test_dead_and_expiring_sandboxes_are_never_handed_out(isolated_dirs, monkeypatch):
    handles = Handles()
    pool = handles.pool(isolated_dirs, per_key=1)
    pool.replenish(CPU2)
    pool.settle(timeout_s=5)
    handles.dead.add(1)
    assert pool.take(CPU2) is None and handles.discarded == [1]
    pool.replenish(CPU2)
    pool.settle(timeout_s=5)
    monkeypatch.setattr(sandbox.base, "WARM_IDLE_S", 0.0)  # every sandbox is about to exit on its own
    assert pool.take(CPU2) is None and handles.discarded == [1, 2]


def test_a_closed_pool_stops_everything_and_starts_nothing(isolated_dirs):
    handles = Handles()
    pool = handles.pool(isolated_dirs, per_key=2)
    pool.replenish(CPU2)
    pool.settle(timeout_s=5)
    pool.close()
    assert sorted(handles.discarded) == [1, 2] and pool.size() == 0
    pool.replenish(CPU2)
    pool.settle(timeout_s=5)
    assert handles.count == 2 and pool.take(CPU2) is None


# ---------------------------------------------------------------- the process backend's clean-up


def test_kill_launch_kills_every_process_carrying_the_launch_marker():
    from sandbox.process import kill_launch

    sleeper = ["sleep", "60"]
    marked = subprocess.Popen(sleeper, env={**os.environ, "PKB_LAUNCH": "feedface"}, start_new_session=True)
    other = subprocess.Popen(sleeper, env={**os.environ, "PKB_LAUNCH": "cafe"}, start_new_session=True)
    try:
        time.sleep(0.2)  # its environment is readable once it runs
        kill_launch(marked.pid, "PKB_LAUNCH=feedface")
        assert marked.wait(timeout=10) == -9
        assert other.poll() is None, "another launch's process is left alone"
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- the container a Docker launch asks for


class StubContainer:
    def __init__(self, labels: dict[str, str] | None = None) -> None:
        self.labels = labels or {}
        self.removed = self.started = False

    def start(self) -> None:
        self.started = True

    def wait(self, timeout: float) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, **_: Any) -> bytes:
        return b"launcher said bye"

    def kill(self) -> None:
        raise AssertionError("a container that exited is not killed")

    def remove(self, force: bool = False) -> None:
        self.removed = True


class StubClient:
    """Answers what DockerBackend asks of an engine; records the containers it was asked to create."""

    def __init__(self, existing: list[StubContainer] | None = None) -> None:
        self.existing = existing or []
        self.created: list[tuple[str, list[str], dict[str, Any]]] = []
        self.containers = self

    def list(self, all: bool, filters: dict[str, str]) -> list[StubContainer]:
        assert filters == {"label": "pkb.sandbox"}
        return self.existing

    def create(self, image: str, command: list[str], **options: Any) -> StubContainer:
        self.created.append((image, command, options))
        self.last = StubContainer()
        return self.last


@pytest.fixture
def docker_backend(monkeypatch, tmp_path):
    from sandbox.docker import DockerBackend

    monkeypatch.setenv("PKB_SANDBOX_IMAGE", "pkb-sandbox:stub")
    monkeypatch.setenv("PKB_SANDBOX_MEMORY", "5g")
    monkeypatch.setenv("PKB_SANDBOX_PIDS", "77")
    monkeypatch.setenv("PKB_SANDBOX_SHM", "1g")
    monkeypatch.setenv("PKB_TEST_SECRET", "do-not-pass")
    client = StubClient()
    backend = DockerBackend(client)  # type: ignore[arg-type]
    backend.extensions_dir = tmp_path / "extensions"
    return backend, client


def test_a_docker_launch_asks_for_a_locked_down_container(docker_backend, tmp_path):
    from sandbox.docker import owner_id

    backend, client = docker_backend
    launch_dir = tmp_path / "pkb-launch-abc"
    launch_dir.mkdir()
    launch = base.SandboxLaunch(
        launch_id="abc",
        launch_dir=launch_dir,
        config={"mode": "outputs", "launch_dir": str(launch_dir), "seeds": [7]},
        device="cpu",
        gpus=[],
        timeout_s=30,
        harness_root=Path("/opt/harness-root"),
        threads=3,
        cpus=((2, 3), (4, 5)),
    )
    run = backend.run(launch)
    assert run.exit_code == 0 and not run.killed_at_deadline and run.launcher_log == "launcher said bye"
    assert client.last.started and client.last.removed, "the container is removed after its launch"
    ((image, command, options),) = client.created
    assert image == "pkb-sandbox:stub" and command[1:3] == ["-m", "harness.launch"]
    assert options["network_mode"] == "none" and options["read_only"] is True
    assert options["cap_drop"] == ["ALL"] and options["security_opt"] == ["no-new-privileges"]
    assert options["user"] == "65534:65534" and options["ipc_mode"] == "private"
    assert (options["mem_limit"], options["memswap_limit"], options["pids_limit"], options["shm_size"]) == (
        5 << 30,
        5 << 30,
        77,
        1 << 30,
    )
    # the tmpfs folders are charged to the container's memory: within it; no file over the size cap
    assert f"size={5 << 29}" in options["tmpfs"]["/tmp"].split(",")
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in options["ulimits"]} == {
        ("fsize", 16 << 30, 16 << 30),
        ("core", 0, 0),
    }
    assert options["labels"] == {"pkb.sandbox": "1", "pkb.launch": "abc", "pkb.owner": owner_id()}
    assert options["cpuset_cpus"] == "2,3,4,5"
    env = options["environment"]
    assert (
        env["NCCL_NVLS_ENABLE"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "3"
    )
    assert "PKB_TEST_SECRET" not in env, "the host's environment does not reach the sandbox"
    mounts = {m["Target"]: m for m in options["mounts"]}
    assert mounts["/launch"]["Source"] == str(launch_dir) and mounts["/launch"]["ReadOnly"] is False
    assert mounts["/usr"]["ReadOnly"] and mounts["/opt/pkb/harness"]["ReadOnly"]
    assert mounts["/opt/pkb/harness"]["Source"] == "/opt/harness-root/harness"
    # no cache mount: the launch's own entries only, in its own view (pkb_mcp/extension_view.py show_entries)
    assert not any("extensions" in target for target in mounts)
    assert env["PKB_EXTENSIONS"] == "/launch/.pkb-cache"
    assert all(m["ReadOnly"] for target, m in mounts.items() if target != "/launch")
    written = json.loads((launch_dir / base.CONFIG_NAME).read_text())
    assert written["launch_dir"] == "/launch", "host paths are rewritten to the container's"


def test_a_docker_launch_forks_its_ranks_from_a_set_up_that_holds_no_secret(docker_backend, tmp_path):
    """A rank launch's container starts its launcher with the ranks' set-up (harness/launch.py
    `--ranks`): on its command line, which every process of the container can read, so it must hold
    nothing of the launch's seeds or end token; a tool launch starts as before."""
    backend, client = docker_backend
    launch_dir = tmp_path / "pkb-launch-ranks"
    launch_dir.mkdir()
    config = {
        "mode": "outputs",
        "launch_dir": str(launch_dir),
        "world_size": 2,
        "device": "cpu",
        "threads_per_rank": 1,
        "rank_cpus": [],
        "timeout_s": 30.0,
        "seeds": [424242424242],
        "end_token": "tok-secret-123",
    }
    cpus = ((0,), (1,))
    for cfg in (config, {"mode": "build", "launch_dir": str(launch_dir), "timeout_s": 30.0}):
        launch = base.SandboxLaunch("ranks", launch_dir, cfg, "cpu", [], 30, Path("/opt/h"), 1, cpus)
        backend.run(launch)
    (_, ranks_command, _), (_, tool_command, _) = client.created
    setup = json.loads(ranks_command[ranks_command.index("--ranks") + 1])
    assert setup["world_size"] == 2 and setup["launch_dir"] == "/launch"
    assert "424242424242" not in " ".join(ranks_command) and "tok-secret" not in " ".join(ranks_command)
    assert "--ranks" not in tool_command


def test_forked_ranks_exist_before_their_launcher_reads_the_launch(monkeypatch, tmp_path):
    """The ranks are forked first, so no rank's memory holds the launch's seeds or end token; a launch
    that does not fit them is refused and the ranks let go."""
    from harness import launch as launcher

    order: list[str] = []
    sent: list[object] = []
    cfg = {"mode": "outputs", "world_size": 2, "device": "cpu", "launch_dir": str(tmp_path)}
    monkeypatch.setattr(launcher, "spawn", lambda setup, fork: order.append(f"spawn fork={fork}") or [1, 2])
    monkeypatch.setattr(launcher, "read_config", lambda path: order.append("read") or dict(cfg))
    monkeypatch.setattr(launcher, "launch", lambda rank_cfg, procs: order.append("launch") or {"ok": 1})
    monkeypatch.setattr(launcher, "_send", lambda proc, message, close: sent.append(message))
    setup = {"world_size": 2, "device": "cpu"}
    args = {"--config-file": str(tmp_path / "cfg")}
    assert launcher._forked_ranks(setup, args) == (str(tmp_path), {"ok": 1})  # type: ignore[arg-type]
    assert order == ["spawn fork=True", "read", "launch"]
    cfg["world_size"] = 3
    with pytest.raises(SystemExit, match="does not fit"):
        launcher._forked_ranks(setup, args)  # type: ignore[arg-type]
    assert sent == [None, None], "each forked rank told to leave"


class RunningContainer(StubContainer):
    """A container that never exits by itself; its removal waits for `gate`."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.gate = threading.Event()

    def wait(self, timeout: float) -> dict[str, int]:
        import requests.exceptions

        time.sleep(timeout)
        raise requests.exceptions.ReadTimeout()

    def remove(self, force: bool = False) -> None:
        assert force, "a running container is removed by force"
        self.gate.wait(10)
        self.removed = True


def test_a_clean_end_returns_at_once_and_the_container_goes_in_the_background(docker_backend, tmp_path):
    """The launcher's clean record ends the launch's wait; the container's removal does not hold it up,
    and settle_ended (before a benchmark) waits for that removal."""
    import threading

    from sandbox.docker import ENDED_POLL_S

    backend, client = docker_backend

    def create(image: str, command: list[str], **options: Any) -> RunningContainer:
        client.last = RunningContainer()
        return client.last

    client.create = create
    launch_dir = tmp_path / "pkb-launch-abd"
    launch_dir.mkdir()
    record = launch_dir / "launch.json"
    launch = base.SandboxLaunch(
        launch_id="abd",
        launch_dir=launch_dir,
        config={"mode": "outputs", "launch_dir": str(launch_dir)},
        device="cpu",
        gpus=[],
        timeout_s=30,
        harness_root=Path("/opt/harness-root"),
        ended=lambda d: (d / "launch.json").exists(),
    )
    t0 = time.monotonic()  # before the timer starts: the record cannot appear sooner than 0.2 s after it
    threading.Timer(0.2, record.write_text, args=("{}",)).start()
    run = backend.run(launch)
    waited = time.monotonic() - t0
    assert run.exit_code == 0 and not run.killed_at_deadline and not run.cancelled
    assert 0.2 <= waited < 5, f"seen within polls of {ENDED_POLL_S} s, not at the deadline (40 s)"
    assert "ended_cleanly" in run.steps_s and "removed" not in run.steps_s
    container = client.last
    assert not container.removed, "its removal runs in the background"
    settled = threading.Thread(target=backend.settle_ended)
    settled.start()
    settled.join(0.3)
    assert settled.is_alive(), "settle_ended waits for the removal"
    container.gate.set()
    settled.join(10)
    assert not settled.is_alive() and container.removed


def test_only_containers_of_gone_owners_are_swept(monkeypatch):
    from sandbox import docker as docker_backend_module

    here = socket.gethostname()
    ours = StubContainer({"pkb.owner": f"{here}:{os.getpid()}"})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = StubContainer({"pkb.owner": f"{here}:{gone.pid}"})
    elsewhere = StubContainer({"pkb.owner": f"other-{here}:{os.getpid()}"})
    unowned = StubContainer()
    client = StubClient([ours, dead, elsewhere, unowned])
    assert docker_backend_module.sweep(client) == 3  # type: ignore[arg-type]
    assert not ours.removed and dead.removed and elsewhere.removed and unowned.removed


# ---------------------------------------------------------------- process backend: TMPDIR


def test_a_deep_launch_folder_reaches_its_tmp_through_a_short_link(tmp_path):
    from sandbox import process

    shallow = Path("/tmp/t")  # short wherever pytest puts its folders
    assert process.short_tmp("0123456789abcdef", shallow) == shallow
    deep = tmp_path / ("d" * 80) / "tmp"
    deep.mkdir(parents=True)
    link = process.short_tmp("0123456789abcdef", deep)
    try:
        assert link == process.SHORT_ROOT / "pkb-0123456789abcdef" and link.resolve() == deep.resolve()
        assert len(f"{link}/ncu-r7/symm_mem-{2**22}") <= process.SOCKET_PATH_MAX
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # what torch's symmetric memory does
            s.bind(str(link / "symm_mem-1"))
        assert (deep / "symm_mem-1").is_socket()
    finally:
        process._drop_short_tmp("0123456789abcdef")
    assert not link.is_symlink() and deep.is_dir(), "only the link goes"


def test_every_registered_backend_declares_the_one_interface():
    """The host asks a backend what it can do (sandbox/backend.py) and never probes it: every row of
    the registry is a Backend with a name and a note, and what it does not declare has its default."""
    from sandbox.backend import BACKENDS, Backend, backend_class

    for name in BACKENDS:
        cls = backend_class(name)
        assert issubclass(cls, Backend) and cls.name == name and cls.note
    process = select_backend("process")
    assert process.ends_early is False
    assert backend_class("docker").ends_early and backend_class("docker").isolated

    class Bare(Backend):
        name, note = "bare", "a backend with no capability but run"

        def run(self, launch, cancel=None):
            raise NotImplementedError

    bare = Bare()
    assert bare.enable_pool(lambda _: Path("/nowhere"), Path("/nowhere")) is None and bare.pool is None
    bare.disable_pool()
    bare.settle_ended()
    assert not bare.isolated and not bare.ends_early


def test_a_container_removed_before_its_log_is_read_ends_its_launch_without_raising(docker_backend, tmp_path):
    """A sweep (the server stopping, `pkb doctor`) may remove a container between its exit and the
    read of its log: the engine answers 409, and the launch ends with a note, not an exception."""
    import docker

    backend, client = docker_backend

    class Swept(StubContainer):
        def logs(self, **_: Any) -> bytes:
            raise docker.errors.APIError("409 Client Error: Conflict (container marked for removal)")

    def create(image: str, command: list[str], **options: Any) -> StubContainer:
        client.last = Swept()
        return client.last

    client.create = create  # type: ignore[method-assign]
    launch_dir = tmp_path / "pkb-launch-swept"
    launch_dir.mkdir()
    cfg = {"mode": "build", "launch_dir": str(launch_dir)}
    launch = base.SandboxLaunch("swept", launch_dir, cfg, "cpu", [], 30, Path("/opt/h"), 1)
    run = backend.run(launch)
    assert run.exit_code == 0 and "could not be read" in run.launcher_log and "409" in run.launcher_log
