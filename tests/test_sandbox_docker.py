"""The Docker sandbox against hostile candidates: each escape is contained and reported, and nothing
is left behind (no container, no process, no launch directory). .ci/run starts a Docker engine and sets
PKB_REQUIRE_DOCKER=1, so there these tests fail rather than skip when the engine is missing."""

import contextlib
import os
import socket
import threading

import pytest

from pkb_mcp import service
from pkb_mcp.models import RunRequest
from sandbox import select_backend
from sandbox.docker import LABEL, sweep

from .conftest import CANDIDATES, ROOT, docker_client, launch_processes

CLIENT = docker_client()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("small_docker_limits"),
    pytest.mark.skipif(CLIENT is None, reason="no Docker engine answers"),
]


def assert_clean(launches_dir):
    from sandbox.docker import OWNER_LABEL, owner_id, removals

    removals.drain()  # a launch that ended cleanly has its container removed in the background
    mine = CLIENT.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_id()}"})
    assert mine == [], "no container may survive"
    assert launch_processes(launches_dir) == [], "no process may survive"
    assert list(launches_dir.iterdir()) == [], "no launch directory may survive"


def check(path, **kw):
    kw.setdefault("world_size", 2)
    kw.setdefault("trials", 1)
    return service.check(RunRequest(problem=1, path=path, device="cpu", sandbox="docker", **kw))


def hostile(tmp_path, body):
    path = tmp_path / "hostile.py"
    path.write_text("import torch\nimport torch.distributed as dist\n\n\ndef solution(x):\n" + body)
    return path


def test_reference_and_wrong_candidate_in_docker(isolated_dirs, monkeypatch):
    """With the unseen-size trial beside the judged trials: the reference generalizes; a failed check
    kills the trial's containers or waits for their end."""
    ok = check(ROOT / "problems" / "001_allreduce.py", trials=2, unseen=True)
    assert ok.verdict == "pass" and ok.sandbox.backend == "docker" and ok.sandbox.isolated
    assert ok.generalizes == "yes", ok.unseen
    assert not any("not isolated" in w or "without isolation" in w for w in ok.warnings)
    bad = check(ROOT / "examples" / "wrong_allreduce_half.py", unseen=True)
    assert bad.verdict == "fail" and bad.ranks[0].first_mismatch.index[0] == 512  # the first unreduced row
    assert bad.generalizes is None and bad.unseen is None
    # the candidate prints nothing, so its ranks' logs hold nothing: no library's warning reaches the
    # agent (gloo's "Unable to resolve hostname", in a container without a network, did for every rank)
    assert [r.log_tail for r in bad.ranks] == [None, None]
    assert_clean(isolated_dirs)


@pytest.mark.parametrize(
    ("candidate", "state", "words"),
    [
        ("raises_on_rank1.py", "error", "rank 1 gives up"),
        ("segfaults.py", "crashed", "SIGSEGV"),
        ("hangs.py", "timeout", "deadline"),
    ],
)
def test_failing_candidates_in_docker(candidate, state, words, isolated_dirs):
    r = check(CANDIDATES / candidate, timeout_s=20 if candidate == "hangs.py" else 120)
    assert state in {x.state for x in r.ranks} and words in r.message
    assert_clean(isolated_dirs)


def test_a_clean_launch_leaves_its_container_s_end_to_the_background_and_a_failed_one_waits(isolated_dirs):
    """The engine's teardown of a container takes 50-150 ms: a launch whose ranks all ended ok returns
    without it (the container is removed in the background); any other waits for the container's
    exit and removes it before it returns."""
    from structlog.testing import capture_logs

    from pkb_mcp import log

    log.configure("info")
    try:
        with capture_logs() as logs:
            ok = check(ROOT / "problems" / "001_allreduce.py")
            bad = check(CANDIDATES / "raises_on_rank1.py")
    finally:
        log.configure()
    assert ok.verdict == "pass" and bad.verdict == "fail"
    steps = [(e["ok"], e["sandbox_steps_s"]) for e in logs if e["event"] == "launch.end"]
    clean = [s for good, s in steps if good]
    failed = [s for good, s in steps if not good]
    assert clean and all("ended_cleanly" in s and "removed" not in s for s in clean), steps
    assert failed and all("exited" in s and "removed" in s for s in failed), steps
    assert_clean(isolated_dirs)


def test_a_launch_s_ranks_are_forks_of_its_launcher_which_imported_torch_once(isolated_dirs):
    """Each rank of a launch that starts with its container is forked from its launcher once that has
    imported torch (harness/launch.py `--ranks`): a rank's process is a few milliseconds old when it
    starts, where a new interpreter importing torch took 7.9-8.5 s beside a check's other launches on
    2 cores (docs/sandbox.md, "A check's start-up")."""
    from structlog.testing import capture_logs

    from pkb_mcp import log

    log.configure("info")
    try:
        with capture_logs() as logs:
            ok = check(ROOT / "problems" / "001_allreduce.py")
    finally:
        log.configure()
    assert ok.verdict == "pass", ok.message
    started = [e["startup_s"] for e in logs if e["event"] == "launch.end"]
    assert len(started) == 2 and all(0 <= s["process"] < 1.0 and "group" in s for s in started), started
    assert_clean(isolated_dirs)


def test_network_is_unreachable(tmp_path, isolated_dirs):
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(4)
    listener.settimeout(30)
    port = listener.getsockname()[1]
    hits = []

    def accept():
        with contextlib.suppress(OSError):  # closed at the end of the test: nobody came
            hits.append(listener.accept())

    threading.Thread(target=accept, daemon=True).start()
    host_ip = socket.gethostbyname(socket.gethostname())
    body = (
        f"    import socket\n    for host in ('127.0.0.1', '{host_ip}', '172.17.0.1', '1.1.1.1'):\n"
        f"        try:\n            socket.create_connection((host, {port}), timeout=2)\n"
        f"            raise SystemError('CONNECTED to ' + host)\n        except OSError:\n            pass\n"
        "    raise RuntimeError('network blocked')\n"
    )
    r = check(hostile(tmp_path, body))
    assert all(x.state == "error" for x in r.ranks), r.message
    assert "network blocked" in r.message and "CONNECTED" not in r.message
    assert hits == []
    listener.close()
    assert_clean(isolated_dirs)


def test_host_files_are_invisible(tmp_path, isolated_dirs):
    planted = tmp_path / "planted-secret.txt"
    planted.write_text("TOP-SECRET-VALUE")
    targets = [str(planted), "/root/.bashrc", "/etc/shadow", str(ROOT / "pyproject.toml")]
    body = (
        f"    import os\n    seen = [p for p in {targets!r} if os.path.exists(p)]\n"
        "    raise RuntimeError('visible: ' + repr(seen) + ' etc: ' + repr(sorted(os.listdir('/etc'))))\n"
    )
    r = check(hostile(tmp_path, body))
    assert "visible: []" in r.message, r.message
    assert "shadow" not in r.message and "TOP-SECRET" not in r.message
    assert_clean(isolated_dirs)


def test_writes_outside_the_job_directory_fail(tmp_path, isolated_dirs):
    body = (
        "    import os\n    errors = []\n"
        "    for p in ('/usr/pwned', '/etc/pwned', '/pwned', '/opt/pkb/harness/x.py'):\n"
        "        try:\n            open(p, 'w').write('x')\n            errors.append('WROTE ' + p)\n"
        "        except OSError as e:\n            errors.append(type(e).__name__)\n"
        "    raise RuntimeError(' '.join(errors))\n"
    )
    r = check(hostile(tmp_path, body))
    assert "WROTE" not in r.message, r.message
    assert "OSError" in r.message or "PermissionError" in r.message, r.message
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/pwned")
    assert_clean(isolated_dirs)


def test_fork_bomb_hits_the_pid_limit(tmp_path, isolated_dirs):
    body = (
        "    import os, time\n    for _ in range(100000):\n        try:\n            if os.fork() == 0:\n"
        "                time.sleep(60)\n                os._exit(0)\n        except OSError:\n"
        "            raise RuntimeError('fork refused: pid limit')\n"
    )
    r = check(hostile(tmp_path, body), timeout_s=40)
    assert r.verdict in ("fail", "timeout")
    assert "pid limit" in r.message or r.verdict == "timeout", r.message
    assert_clean(isolated_dirs)


def test_unbounded_allocation_hits_the_memory_limit(tmp_path, isolated_dirs):
    body = "    hoard = []\n    while True:\n        hoard.append(bytearray(64 << 20))\n"
    r = check(hostile(tmp_path, body), timeout_s=60)
    assert r.verdict in ("fail", "timeout") and any(
        x.state in ("crashed", "error", "aborted") for x in r.ranks
    )
    assert_clean(isolated_dirs)


def test_only_containers_of_dead_owners_are_swept():
    import socket

    from sandbox.docker import OWNER_LABEL, owner_id
    from sandbox.image import ensure_image

    image = ensure_image(CLIENT)
    dead = CLIENT.containers.create(
        image, ["/usr/bin/true"], labels={LABEL: "1", OWNER_LABEL: f"{socket.gethostname()}:999999999"}
    )
    live = CLIENT.containers.create(image, ["/usr/bin/true"], labels={LABEL: "1", OWNER_LABEL: owner_id()})
    try:
        sweep(CLIENT)
        left = {c.id for c in CLIENT.containers.list(all=True, filters={"label": LABEL})}
        assert dead.id not in left, "a dead server's container is removed"
        assert live.id in left, "a live process's container is left alone"
    finally:
        live.remove(force=True)


def test_auto_prefers_docker():
    assert select_backend("auto").name == "docker"


def test_the_engine_answers_a_ping_quickly_and_may_take_longer_to_start_a_container():
    from sandbox.docker import API_TIMEOUT_S, connect

    client = connect(timeout_s=3.0)
    assert client.api.timeout == API_TIMEOUT_S >= 30


def test_gpu_jobs_tell_triton_where_the_driver_is(tmp_path, monkeypatch):
    """The container has no /sbin/ldconfig (nor its cache), Triton's way to find libcuda: the
    driver's folder is passed as TRITON_LIBCUDA_PATH, with exactly the launch's GPU device nodes."""
    import sandbox.docker as sd

    (tmp_path / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setattr(sd, "LIBCUDA_SEARCH", (str(tmp_path / "missing"), str(tmp_path)))

    class NoRuntime:
        def info(self):
            return {"Runtimes": {"runc": {}}}

    setup = sd._gpu_setup(NoRuntime(), [2, 3])
    assert setup["environment"] == {"CUDA_VISIBLE_DEVICES": "0,1", "TRITON_LIBCUDA_PATH": str(tmp_path)}
    assert [d for d in setup["devices"] if d.startswith("/dev/nvidia") and d[11].isdigit()] == [
        "/dev/nvidia2:/dev/nvidia2",
        "/dev/nvidia3:/dev/nvidia3",
    ]
    monkeypatch.setattr(sd, "LIBCUDA_SEARCH", (str(tmp_path / "missing"),))
    assert "TRITON_LIBCUDA_PATH" not in sd._gpu_setup(NoRuntime(), [0])["environment"]


@pytest.mark.slow
def test_warm_containers_serve_one_job_each_and_leave_nothing(isolated_dirs):
    """Containers started ahead of need: a warm launch's outputs equal a cold one's; closing the pool
    removes every container, process and directory."""
    from sandbox.docker import DockerBackend

    from .test_warm_pool import run_pool_lifecycle

    run_pool_lifecycle(DockerBackend(CLIENT), isolated_dirs)
    assert_clean(isolated_dirs)


def test_a_benchmark_of_several_jobs_takes_a_warm_container_for_each(isolated_dirs, monkeypatch):
    from sandbox.docker import DockerBackend

    from .test_warm_pool import run_bench_with_pool

    run_bench_with_pool(DockerBackend(CLIENT), isolated_dirs, monkeypatch)
    assert_clean(isolated_dirs)


def test_a_warm_container_that_died_is_reported_with_how_it_ended(isolated_dirs):
    from sandbox.docker import DockerBackend

    from .test_warm_pool import run_died_report

    def stop(container):
        container.kill()
        container.wait(timeout=60)

    run_died_report(DockerBackend(CLIENT), isolated_dirs, stop, "exit code 137")
    assert_clean(isolated_dirs)


def test_gated_containers_wait_before_the_process_group_and_serve_their_launch(isolated_dirs, monkeypatch):
    """A GPU shape's containers warm up in two steps (sandbox/pool.py): the host's go file reaches the
    launcher inside the container, and the launch alone opens one that is still closed."""
    from sandbox.docker import DockerBackend

    from .test_warm_pool import run_gated

    run_gated(DockerBackend(CLIENT), isolated_dirs, monkeypatch)
    assert_clean(isolated_dirs)


def test_a_launch_sees_no_other_tenant_s_extension_cache_entries(tmp_path, isolated_dirs):
    """The node's cache is not mounted: a candidate finds neither another source's library nor its
    objects, wherever it looks (its view, the old mount point, its launch directory)."""
    from pkb_mcp import config

    theirs = config.extensions_dir() / ("e" * 64)
    theirs.mkdir()
    (theirs / "theirs.so").write_bytes(b"THEIR-KERNEL")
    (theirs / "ok.json").write_text("{}")
    (config.extensions_dir() / "objects").mkdir()
    (config.extensions_dir() / "objects" / f"{'f' * 64}.o").write_bytes(b"THEIR-OBJECT")
    body = (
        "    import os\n    found = []\n"
        "    for top in (os.environ.get('PKB_EXTENSIONS', '/nowhere'), '/opt/pkb/extensions', '/launch'):\n"
        "        for d, _, files in os.walk(top):\n"
        "            found += [os.path.join(d, f) for f in files if f.endswith(('.so', '.o', 'ok.json'))]\n"
        "    raise RuntimeError('found: ' + repr(found))\n"
    )
    r = check(hostile(tmp_path, body))
    assert "found: []" in r.message, r.message
    assert_clean(isolated_dirs)
