"""Jobs on a Ray cluster (pkb_mcp/jobs/cluster.py, docs/scale-out.md): a local cluster of two worker nodes
with 4 logical GPUs each runs CPU jobs (process backend, gloo ranks). Checks and a `pkb eval` of the
examples spread over both nodes and never span two; a second check on a node takes the warm sandboxes
of that node's actor; a node lost mid-job re-queues it, and so does a lost lease, whose launches end;
cancellation reaches the remote job; a restarted server collects a job that ran on; a profile's trace
and timeline come back to the server's profiles folder (to a restarted server too). One cluster for
the module; each test closes the node actors it made (their warm sandboxes with them)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pkb_mcp.errors import UserError
from pkb_mcp.jobs import scheduler as sched
from pkb_mcp.jobs.store import JobStore

from .conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "original"
CANDIDATES = ROOT / "tests" / "candidates"
REFERENCE_1 = ROOT / "problems" / "001_allreduce.py"
GPUS_PER_NODE = 4

# ---------------------------------------------------------------- a real local cluster

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from pkb_mcp.jobs.cluster import RayCluster, actor_name, close_nodes  # noqa: E402
from pkb_mcp.models import RunRequest  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    # Ray's own memory monitor kills workers at 95% of the machine's memory, which a shared CI
    # machine reaches through others' processes; the kernel's OOM killer still applies
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    c.connect(namespace="pkb")  # before the workers exist: the driver stays on the head, never removed
    for _ in range(2):
        c.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(autouse=True)
def closed_nodes(cluster):
    """Each test's node actors are closed at its end: their warm sandboxes would crowd the next one's
    (and a test with its own PKB_LAUNCH_DIR gets node actors of its own)."""
    yield
    close_nodes()


@pytest.fixture
def server(cluster, tmp_path):
    """A scheduler on the cluster, as `pkb serve --ray` makes it; stopped at the end."""
    made: list[sched.Scheduler] = []

    def make() -> sched.Scheduler:
        s = sched.Scheduler(JobStore(tmp_path / "jobs.sqlite"), 0, cluster=RayCluster(cluster.address))
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def check_params(path: Path, world_size: int = 2, trials: int = 1, timeout_s: float = 60) -> RunRequest:
    return RunRequest(
        problem=1,
        path=str(path),
        world_size=world_size,
        device="cpu",
        timeout_s=timeout_s,
        sandbox="process",
        trials=trials,
    )


def processes_under(folder: Path) -> list[int]:
    """Processes whose working directory is under `folder` (a job directory of this test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(Path(os.readlink(entry / "cwd"))).startswith(str(folder)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def launch_processes(folder: Path, text: str) -> set[int]:
    """Processes of the launches under `folder` whose candidate contains `text` (a warm sandbox not
    yet taken has no candidate: its processes do not count)."""
    found = set()
    for pid in processes_under(folder):
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            launch = folder / cwd.relative_to(folder).parts[0]
            if text in (launch / "src" / "solution.py").read_text():
                found.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def running(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}


@pytest.mark.integration
def test_checks_spread_over_the_nodes_and_never_span_two(server):
    s = server()
    example = EXAMPLES / "001_allreduce_torch.py"
    # world size 3 of nodes of 4: two such jobs cannot share a node, and neither can span two
    jobs = [s.submit("check", check_params(example, world_size=3)) for _ in range(2)]
    with pytest.raises(UserError, match=r"largest node of the Ray cluster .* has 4"):
        s.submit("check", check_params(example, world_size=GPUS_PER_NODE + 1))
    wait_for(lambda: all(s.get(j).terminal for j in jobs), what="both checks")
    for j in jobs:
        assert s.get(j).state == "done", s.get(j)
        assert s.result(j)["verdict"] == "pass"  # type: ignore[index]
    placed = [s.ray_table.where(j) for j in jobs]  # type: ignore[union-attr]
    assert {node for node, _ in placed} == alive_nodes(), placed
    for _, gpus in placed:
        assert len(gpus) == 3 and all(0 <= g < GPUS_PER_NODE for g in gpus)


@pytest.mark.integration
def test_cancellation_reaches_the_remote_job(server, isolated_dirs):
    s = server()
    job = s.submit("check", check_params(CANDIDATES / "hangs.py", timeout_s=120))
    wait_for(lambda: s.ray_table.where(job)[0] is not None, what="the job to be placed")  # type: ignore[union-attr]
    wait_for(lambda: launch_processes(isolated_dirs, "Never returns"), 60, "the candidate's ranks to start")
    ranks = launch_processes(isolated_dirs, "Never returns")
    t0 = time.monotonic()
    s.cancel(job)
    wait_for(lambda: s.get(job).terminal, 60, "the cancellation")
    assert s.get(job).state == "cancelled" and time.monotonic() - t0 < 30
    wait_for(lambda: not running(ranks), 20, "the job's processes to end")


@pytest.mark.integration
def test_a_second_check_on_the_same_node_takes_warm_sandboxes(server, isolated_dirs):
    """As on one node (tests/test_warm_pool.py), the backend's own report of each launch says whether
    it ran in a sandbox started ahead of need; the node's actor counts them for each job."""
    s = server()
    params = check_params(EXAMPLES / "001_allreduce_torch.py")
    first = s.submit("check", params)
    wait_for(lambda: s.get(first).terminal, what="the first check")
    assert s.get(first).state == "done" and s.result(first)["verdict"] == "pass", s.get(first)  # type: ignore[index]
    node, _ = s.ray_table.where(first)  # type: ignore[union-attr]
    # the reference's launch started cold on a node actor of its own (this test's settings); the
    # candidate's may have taken a sandbox the reference's end started
    assert s.ray_table.warm(first) in (0, 1)  # type: ignore[union-attr]
    (other,) = alive_nodes() - {node}
    holder = hold_node(other)  # the second check can only go where the first ran
    try:
        second = s.submit("check", params)
        wait_for(lambda: s.get(second).terminal, what="the second check")
    finally:
        ray.kill(holder)
    assert s.get(second).state == "done" and s.result(second)["verdict"] == "pass", s.get(second)  # type: ignore[index]
    assert s.ray_table.where(second)[0] == node  # type: ignore[union-attr]
    assert s.ray_table.warm(second) == 2, "the reference and the candidate both started warm"  # type: ignore[union-attr]


def profile_params(profiles: Path) -> RunRequest:
    """Problem 1's reference profiled against itself, the server's profiles folder named as the MCP
    server names it (the state directory's profiles/, beside sources/)."""
    return RunRequest(
        problem=1,
        path=str(REFERENCE_1),
        world_size=2,
        device="cpu",
        timeout_s=120,
        sandbox="process",
        profiles_dir=str(profiles),
    )


def assert_artifacts_landed(result: dict, profiles: Path) -> None:
    """The result's trace and timeline are files of the server, under its profiles folder."""
    assert result["verdict"] == "ok", result["message"]
    for name in ("trace", "timeline"):
        path = Path(result[name]["path"])
        assert path.is_file() and path.resolve().is_relative_to(profiles.resolve()), path
        assert path.stat().st_size == result[name]["bytes"] > 0
    trace = json.loads(Path(result["trace"]["path"]).read_text())
    assert [e for e in trace["traceEvents"] if e["ph"] == "X"], "the trace has events"
    assert Path(result["timeline"]["path"]).read_bytes()[:4] == b"\x89PNG"
    assert not any("cluster node was left out" in w for w in result["warnings"]), result["warnings"]


@pytest.mark.integration
def test_a_profile_brings_its_trace_and_timeline_back_to_the_server(server, tmp_path):
    import anyio
    from mcp import Client

    from pkb_mcp.frontends.server import build_server

    s = server()
    state = tmp_path / "state"
    job = s.submit("profile", profile_params(state / "profiles"))  # no longer refused on a cluster
    wait_for(lambda: s.get(job).terminal, 240, "the profile")
    assert s.get(job).state == "done", s.get(job)
    assert_artifacts_landed(s.result(job), state / "profiles")  # type: ignore[arg-type]
    node, gpus = s.ray_table.where(job)  # type: ignore[union-attr]
    assert node in alive_nodes() and len(gpus) == GPUS_PER_NODE, "a profile holds the whole node"

    async def resources() -> None:  # the MCP resources serve them as on one node
        async with Client(build_server(s, state / "sources")) as c:
            trace = await c.read_resource(f"pkb://jobs/{job}/trace")
            assert json.loads(trace.contents[0].text)["traceEvents"]
            png = await c.read_resource(f"pkb://jobs/{job}/timeline")
            assert png.contents[0].mime_type == "image/png" and png.contents[0].blob

    anyio.run(resources)


@pytest.mark.integration
def test_a_restarted_server_collects_a_profile_with_its_artifacts(server, tmp_path):
    """The node's actor keeps the end, the artifacts' bytes with it, until a server fetched it."""
    first = server()
    profiles = tmp_path / "state" / "profiles"
    job = first.submit("profile", profile_params(profiles))
    wait_for(lambda: first.ray_table.where(job)[0] is not None, what="the profile to be placed")  # type: ignore[union-attr]
    first.stop()
    wait_for(lambda: first.get(job).state == "queued", 30, "the stopping server to leave the job")
    lease = ray.get_actor(actor_name(job), namespace="pkb")
    wait_for(lambda: ray.get(lease.poll.remote(), timeout=30)["end"] is not None, 240, "the profile's end")
    assert not list(profiles.glob("*/*")), "nothing landed while no server collected it"

    second = server()
    wait_for(lambda: second.get(job).terminal, what="the restarted server to collect the profile")
    assert second.get(job).state == "done", second.get(job)
    assert second.ray_table.starts(job) == 1, "collected, not run again"  # type: ignore[union-attr]
    assert_artifacts_landed(second.result(job), profiles)  # type: ignore[arg-type]


def hold_node(node_id: str):
    """An actor holding every GPU of the node, so that no job is placed there while it lives."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, num_gpus=GPUS_PER_NODE)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    ray.get(holder.ready.remote(), timeout=60)
    return holder


@pytest.mark.integration
def test_a_lost_lease_ends_its_launches_and_requeues_the_job(server, isolated_dirs):
    s = server()
    job = s.submit("check", check_params(CANDIDATES / "hangs.py", timeout_s=120))
    wait_for(lambda: launch_processes(isolated_dirs, "Never returns"), 120, "the candidate's ranks to start")
    ranks = launch_processes(isolated_dirs, "Never returns")
    ray.kill(ray.get_actor(actor_name(job), namespace="pkb"), no_restart=True)
    wait_for(lambda: s.ray_table.losses(job) == 1, 60, "the server to see the lease lost")  # type: ignore[union-attr]
    wait_for(lambda: not running(ranks), 30, "the lost lease's launches to end")
    wait_for(lambda: s.ray_table.starts(job) == 2, 60, "the job to run again")  # type: ignore[union-attr]
    s.cancel(job)
    wait_for(lambda: s.get(job).terminal, 60, "the cancellation")
    assert s.get(job).state == "cancelled"


@pytest.mark.integration
def test_a_restarted_server_collects_the_job_that_ran_on(server, cluster, tmp_path):
    first = server()
    job = first.submit("check", check_params(EXAMPLES / "001_allreduce_torch.py", trials=3))
    wait_for(lambda: first.ray_table.where(job)[0] is not None, what="the job to be placed")  # type: ignore[union-attr]
    first.stop()
    wait_for(lambda: first.get(job).state == "queued", 30, "the stopping server to leave the job")
    assert ray.get_actor(actor_name(job), namespace="pkb") is not None, "the job runs on"

    second = server()
    wait_for(lambda: second.get(job).terminal, what="the restarted server to collect the job")
    assert second.get(job).state == "done" and second.result(job)["verdict"] == "pass"  # type: ignore[index]
    assert second.ray_table.starts(job) == 1, "collected, not run again"  # type: ignore[union-attr]


@pytest.mark.integration
def test_a_node_lost_mid_batch_loses_no_result(server, cluster, isolated_dirs):
    s = server()
    example = EXAMPLES / "001_allreduce_torch.py"
    job = s.submit("check", check_params(example, world_size=GPUS_PER_NODE, trials=3))
    others = [s.submit("check", check_params(example)) for _ in range(2)]
    wait_for(lambda: s.ray_table.where(job)[0] is not None, what="the job to be placed")  # type: ignore[union-attr]
    node_id, _ = s.ray_table.where(job)  # type: ignore[union-attr]
    victim = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    cluster.remove_node(victim, allow_graceful=False)
    cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)  # the cluster stays two nodes
    wait_for(lambda: all(s.get(j).terminal for j in [job, *others]), 240, "the batch")
    for j in [job, *others]:
        assert s.get(j).state == "done" and s.result(j)["verdict"] == "pass", s.get(j)  # type: ignore[index]
    assert s.ray_table.losses(job) == 1 and s.ray_table.starts(job) == 2  # type: ignore[union-attr]
    assert s.ray_table.where(job)[0] != node_id  # type: ignore[union-attr]
    close_nodes()  # the alive nodes' warm sandboxes end: any process left is the lost node's
    wait_for(lambda: not processes_under(isolated_dirs), 30, "the lost node's sandboxes to be killed")


@pytest.mark.integration
@pytest.mark.usefixtures("small_docker_limits")
def test_a_killed_actor_leaves_no_container(server):
    import docker

    from sandbox.docker import LABEL, LAUNCH_LABEL, OWNER_LABEL

    from .conftest import docker_client

    client = docker_client()
    if client is None:
        pytest.skip("no Docker engine answers")
    s = server()
    params = check_params(CANDIDATES / "hangs.py", timeout_s=120).model_copy(update={"sandbox": "docker"})
    job = s.submit("check", params)

    def containers() -> list:
        while True:
            try:  # a container removed while the list is read is not found: read it again
                return [
                    c
                    for c in client.containers.list(all=True, filters={"label": LABEL})
                    if c.labels.get(LAUNCH_LABEL, "")
                    and _owner_pid(c.labels.get(OWNER_LABEL, "")) in actor_pids
                ]
            except docker.errors.NotFound:
                continue

    def node_actor() -> Any:
        """The actor of the job's node once the lease has one: placed comes before the hand-off."""
        node = s.ray_table.where(job)[0]  # type: ignore[union-attr]
        try:
            return None if node is None else ray.get_actor(s.cluster.node_name(node), namespace="pkb")  # type: ignore[union-attr]
        except ValueError:  # not started yet
            return None

    actor_pids: set[int] = set()
    wait_for(lambda: node_actor() is not None, what="the job to be placed and handed to its node's actor")
    node_actor_handle: Any = node_actor()
    actor_pids.add(ray.get(node_actor_handle.ping.remote()))  # the process that runs the node's launches
    wait_for(lambda: any(c.status == "running" for c in containers()), 120, "the job's containers")
    os.kill(next(iter(actor_pids)), 9)  # as Ray kills a worker (or the OOM killer does)
    wait_for(lambda: not containers(), 60, "the reaper to remove the containers")
    s.cancel(job)  # it was re-queued once; end the second run
    wait_for(lambda: s.get(job).terminal, 60, "the cancellation")


def _owner_pid(owner: str) -> int:
    pid = owner.rpartition(":")[2]
    return int(pid) if pid.isdigit() else -1


@pytest.mark.integration
def test_an_eval_too_wide_for_every_node_is_refused_before_any_work(cluster, tmp_path):
    from pkb_mcp.evaluation.batch import evaluate

    with pytest.raises(UserError, match=r"world size 8 needs 8 GPUs on one node .* has 4"):
        evaluate([EXAMPLES], ray=cluster.address, world_size=8, device="cpu", store=tmp_path / "e.sqlite")
    assert not (tmp_path / "e.sqlite").exists()


# the example directory less 008 (a deliberate 25 s hang) and 013 (a C++ build that takes minutes on
# 2 shared cores with other jobs beside it): the same verdicts as on one node (tests/test_evaluate.py)
EVAL_FILES = {
    "001_allreduce_torch.py": "pass",
    "007_reducescatter_torch.py": "wrong",
    "018_tp_rms_norm_torch.py": "pass",
    "021_clip_grad_norm_no_ep_torch.py": "pass",
}


@pytest.mark.integration
def test_pkb_eval_of_the_examples_spreads_over_both_nodes(cluster, tmp_path):
    from tests.test_evaluate import EXPECTED

    batch = tmp_path / "batch"
    batch.mkdir()
    for name, outcome in EVAL_FILES.items():
        assert EXPECTED[name] == outcome
        shutil.copy(EXAMPLES / name, batch / name)
    store = tmp_path / "eval.sqlite"
    cmd = [sys.executable, "-m", "pkb_mcp", "eval", str(batch), "--ray", cluster.address]
    cmd += ["--world-size", "2", "--device", "cpu", "--trials", "1", "--timeout", "60"]
    cmd += ["--sandbox", "process", "--store", str(store), "--out", str(tmp_path / "out"), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout)
    outcomes = {Path(r["file"]).name: r["outcome"] for r in report["results"]}
    assert outcomes == EVAL_FILES, done.stderr[-3000:]
    assert all((r["speedup"] is not None) == (r["outcome"] == "pass") for r in report["results"])
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT j.kind, r.node FROM ray_jobs r JOIN jobs j ON j.id = r.job_id").fetchall()
    assert sorted(kind for kind, _ in rows) == ["bench"] * 3 + ["check"] * 4
    assert {node for _, node in rows} == alive_nodes(), rows


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.integration
@pytest.mark.anyio
async def test_pkb_serve_on_the_cluster_answers_a_check_run_on_a_node(cluster, tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    (tmp_path / "jobs").mkdir(exist_ok=True)
    env = {**os.environ, "PKB_STATE_DIR": str(tmp_path / "state"), "PKB_LAUNCH_DIR": str(tmp_path / "jobs")}
    env["PYTHONPATH"] = str(ROOT)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "pkb_mcp", "serve", "--ray", cluster.address],
        env=env,
        cwd=str(ROOT),
    )
    async with Client(params) as client:
        r = await client.call_tool(
            "run_correctness",
            {
                "problem": "1",
                "path": str(EXAMPLES / "001_allreduce_torch.py"),
                "world_size": 2,
                "trials": 1,
                "device": "cpu",
            },
        )
        assert r.structured_content["result"]["verdict"] == "pass", r.content
    with sqlite3.connect(tmp_path / "state" / "jobs.sqlite") as db:
        nodes = [n for (n,) in db.execute("SELECT node FROM ray_jobs")]
    assert len(nodes) == 1 and nodes[0] in alive_nodes()
