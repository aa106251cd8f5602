"""The MCP server through the SDK's in-process client: tools, errors, progress, jobs, cancellation,
timeouts, restarts, resources and the prompt.

Fast tier: the read-only tools, the resources and the prompt, and every request refused before a job
is queued. Integration tier: the tools that run candidate code (jobs, their progress, cancellation
and timeouts)."""

import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from pkb_mcp.frontends.server import build_server, in_tool_words
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore

from .conftest import CANDIDATES, ROOT, launch_processes
from .tasks_client import TaskHandle, Tasks, cancel_task, get_task

pytestmark = pytest.mark.anyio
REFERENCE_1 = (ROOT / "problems" / "001_allreduce.py").read_text()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state"


def make_server(state):
    scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus=0)
    return build_server(scheduler, state / "sources"), scheduler


@pytest.fixture
async def client(state):
    server, scheduler = make_server(state)
    async with Client(server) as c:
        yield c
    scheduler.stop()


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


async def test_list_and_reference_in_both_forms(client):
    listed = await client.call_tool("list_problems", {"category": "primitive"})
    assert not listed.is_error
    assert {p["id"] for p in listed.structured_content["problems"]} == {1, 2, 3, 4, 5, 6, 7, 8}
    assert "allgather" in text_of(listed)
    ref = await client.call_tool("get_reference", {"problem": "allgather_gemm", "world_size": 4})
    assert ref.structured_content["inputs"][0]["shape"] == [256, 512]
    assert "def solution" in text_of(ref) and "a_local" in text_of(ref)


@pytest.mark.parametrize(
    ("tool", "args", "words"),
    [
        ("get_reference", {"problem": "999"}, "problem 999 does not exist"),
        ("get_reference", {"problem": "12", "world_size": 3}, "cannot run at world size 3"),
        ("roofline", {"problem": "1", "size": "huge"}, "no size preset 'huge'"),
        ("run_correctness", {"problem": "1", "source": "   "}, "the source is empty"),
        ("run_correctness", {"problem": "1"}, "give exactly one of source"),
        # a refused path: tests/test_mcp_paths.py (one sentence whatever the reason)
        ("run_correctness", {"problem": "1", "source": "x", "path": "/x.py"}, "give exactly one of source"),
        ("run_correctness", {"problem": "1", "source": "x" * (1 << 20 + 1)}, "over the limit"),
        (
            "compile_kernel",
            {"source": "__global__ void k() {}", "path": "/x.cu"},
            "give exactly one of source",
        ),
        (
            "run_correctness",
            {"problem": "1", "source": REFERENCE_1, "trials": 0},
            "greater than or equal to 1",
        ),
        (
            "run_correctness",
            {"problem": "1", "source": REFERENCE_1, "trials": 101},
            "less than or equal to 100",
        ),
        ("run_correctness", {"problem": "1", "source": REFERENCE_1, "timeout_s": 0}, "greater than 0"),
        ("run_correctness", {"problem": "1", "source": REFERENCE_1, "convention": "theirs"}, "theirs"),
        (
            "run_correctness",
            {"problem": "12", "source": REFERENCE_1, "world_size": 3, "device": "cpu"},
            "world size 3",
        ),
        ("benchmark", {"problem": "1", "source": REFERENCE_1, "launches": 9}, "less than or equal to 8"),
        ("run_correctness", {"problem": "nope", "source": REFERENCE_1}, "problem nope does not exist"),
        (
            "run_correctness",
            {"problem": "1", "source": REFERENCE_1, "device": "cuda", "world_size": 2},
            "no CUDA GPU is visible on this machine; pass device=cpu",
        ),
        ("benchmark", {"problem": "1", "source": REFERENCE_1, "launches": 0}, "greater than or equal to 1"),
        ("job_status", {"job_id": "feedface"}, "job feedface does not exist"),
        ("job_result", {"job_id": "feedface"}, "job feedface does not exist"),
        ("roofline", {"problem": "999"}, "problem 999 does not exist; see list_problems"),
        ("roofline", {"problem": "1", "time_ms": -1}, "greater than 0"),
        # a source that cannot run is refused before its job, in the CLI's words (issue 51)
        (
            "run_correctness",
            {"problem": "1", "source": "def solution(x:\n", "device": "cpu", "world_size": 2},
            "the solution does not parse: ",
        ),
        (
            "benchmark",
            {"problem": "1", "source": "import torch\n", "device": "cpu", "world_size": 2},
            "defines no solution(): a candidate is a module whose solution(...) takes the reference's "
            "inputs (get_reference prints the signature)",
        ),
        (
            "run_correctness",
            {
                "problem": "1",
                "source": "def solution(a, b):\n    return a\n",
                "device": "cpu",
                "world_size": 2,
            },
            "solution takes 2 parameters (a, b) here; expected solution(x) (ours, 1 argument)",
        ),
    ],
)
async def test_bad_arguments_are_readable_tool_errors(client, tool, args, words):
    result = await client.call_tool(tool, args)
    assert result.is_error
    assert words in text_of(result), text_of(result)
    # one sentence, also as structured content; no CLI flags, no validation dump
    assert result.structured_content == {"error": text_of(result)}
    assert "--" not in text_of(result) and "errors.pydantic.dev" not in text_of(result)
    assert "\n" not in text_of(result)


@pytest.mark.integration
async def test_compile_error_is_a_result_with_line_numbers(client):
    bad = "__global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n"
    result = await client.call_tool("compile_kernel", {"source": bad, "language": "cuda"})
    assert not result.is_error
    compiled = result.structured_content["result"]
    assert compiled["ok"] is False
    errors = [d for u in compiled["units"] for d in u["diagnostics"] if d["severity"] == "error"]
    assert errors and errors[0]["line"] == 2


@pytest.mark.integration
async def test_run_correctness_with_progress_passes_and_fails(client):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    ok = await client.call_tool(
        "run_correctness",
        {"problem": "1", "source": REFERENCE_1, "world_size": 2, "trials": 2, "device": "cpu"},
        progress_callback=on_progress,
    )
    assert not ok.is_error, text_of(ok)
    assert ok.structured_content["state"] == "done"
    assert ok.structured_content["result"]["verdict"] == "pass"
    assert "PASS" in text_of(ok)
    assert seen, "progress notifications arrive while the job runs"
    wrong = (ROOT / "examples" / "wrong_allreduce_half.py").read_text()
    bad = await client.call_tool(
        "run_correctness",
        {"problem": "allreduce", "source": wrong, "world_size": 2, "trials": 1, "device": "cpu"},
    )
    result = bad.structured_content["result"]
    # Row 512 is the first unreduced row; which of its elements is first outside the tolerance
    # depends on the random inputs (a small value from the other rank can fall inside it).
    assert result["verdict"] == "fail" and result["ranks"][0]["first_mismatch"]["index"][0] == 512
    assert len(json.dumps(bad.structured_content)) < 10_000, "compact for clients that cap output"


@pytest.mark.integration
async def test_job_pattern_and_full_result_resource(client):
    sub = await client.call_tool(
        "run_correctness",
        {
            "problem": "1",
            "path": str(CANDIDATES / "raises_on_rank1.py"),
            "world_size": 2,
            "trials": 1,
            "device": "cpu",
            "wait": False,
        },
    )
    job_id = sub.structured_content["job_id"]
    assert sub.structured_content["state"] in ("queued", "running")
    for _ in range(600):
        status = await client.call_tool("job_status", {"job_id": job_id})
        if status.structured_content["state"] == "done":
            break
        await anyio.sleep(0.1)
    got = await client.call_tool("job_result", {"job_id": job_id})
    assert got.structured_content["kind"] == "check"
    assert got.structured_content["result"]["verdict"] == "fail"
    assert "rank 1 gives up" in got.structured_content["result"]["message"]
    full = await client.read_resource(got.structured_content["result_uri"])
    assert "rank 1 gives up" in full.contents[0].text


@pytest.mark.integration
async def test_cancel_job_kills_a_hanging_candidate(client, isolated_dirs):
    sub = await client.call_tool(
        "run_correctness",
        {
            "problem": "1",
            "path": str(CANDIDATES / "hangs.py"),
            "world_size": 2,
            "trials": 1,
            "device": "cpu",
            "wait": False,
            "timeout_s": 600,
        },
    )
    job_id = sub.structured_content["job_id"]
    for _ in range(300):  # until its ranks are up and stuck
        if (await client.call_tool("job_status", {"job_id": job_id})).structured_content[
            "state"
        ] == "running":
            break
        await anyio.sleep(0.1)
    await anyio.sleep(3)
    cancelled = await client.call_tool("cancel_job", {"job_id": job_id})
    for _ in range(100):
        state = (await client.call_tool("job_status", {"job_id": job_id})).structured_content["state"]
        if state == "cancelled":
            break
        await anyio.sleep(0.1)
    assert state == "cancelled", cancelled
    await anyio.sleep(0.5)
    assert launch_processes(isolated_dirs) == [] and list(isolated_dirs.iterdir()) == []


@pytest.mark.integration
async def test_a_timeout_is_reported_per_rank(client):
    r = await client.call_tool(
        "run_correctness",
        {
            "problem": "1",
            "path": str(CANDIDATES / "hangs.py"),
            "world_size": 2,
            "trials": 1,
            "device": "cpu",
            "timeout_s": 12,
        },
    )
    result = r.structured_content["result"]
    assert result["verdict"] == "timeout" and {x["state"] for x in result["ranks"]} == {"timeout"}


@pytest.mark.integration
async def test_results_survive_a_server_restart(state):
    server, scheduler = make_server(state)
    async with Client(server) as c:
        r = await c.call_tool(
            "run_correctness",
            {"problem": "1", "source": REFERENCE_1, "world_size": 2, "trials": 1, "device": "cpu"},
        )
        job_id = r.structured_content["job_id"]
        queued = await c.call_tool(
            "compile_kernel", {"source": "__global__ void k() {}\n", "language": "cuda", "wait": False}
        )
    scheduler.stop()
    server2, scheduler2 = make_server(state)  # a new process would see the same database
    async with Client(server2) as c:
        got = await c.call_tool("job_result", {"job_id": job_id})
        assert got.structured_content["result"]["verdict"] == "pass"
        other = queued.structured_content["job_id"]
        for _ in range(600):
            if (await c.call_tool("job_status", {"job_id": other})).structured_content["state"] == "done":
                break
            await anyio.sleep(0.1)
        assert (await c.call_tool("job_result", {"job_id": other})).structured_content["result"]["ok"]
    scheduler2.stop()


async def test_an_unknown_problem_s_resource_names_the_tool_not_the_cli(client):
    """Issue 51: problem://999/reference answered "see pkb problems", a CLI command."""
    with pytest.raises(MCPError) as refused:
        await client.read_resource("problem://999/reference")
    assert "problem 999 does not exist; see list_problems" in str(refused.value)


async def test_reference_resource_and_attempt_prompt(client):
    ref = await client.read_resource("problem://12/reference")
    assert "def solution(a_local, b_local)" in ref.contents[0].text
    prompt = await client.get_prompt("attempt_problem", {"problem": "12", "world_size": "4"})
    text = prompt.messages[0].content.text
    assert "solution(a_local, b_local)" in text and "multicast" in text and "[256, 512]" in text


async def test_refused_requests_queue_no_job(state):
    """A request refused before any work starts leaves nothing in the job store."""
    server, scheduler = make_server(state)
    submitted: list = []
    scheduler.submit = lambda *job: submitted.append(job)  # the one way a tool queues work
    async with Client(server) as c:
        for args in (
            {"problem": "99", "source": REFERENCE_1},
            {"problem": "1"},
            {"problem": "1", "source": " "},
            {"problem": "1", "source": "def solution(x:\n", "device": "cpu", "world_size": 2},
        ):
            assert (await c.call_tool("run_correctness", args)).is_error
        assert (await c.call_tool("compile_kernel", {"path": "/nonexistent.cu"})).is_error
    assert submitted == []
    scheduler.stop()


async def test_roofline_and_filters_answer_at_once(client):
    roof = await client.call_tool("roofline", {"problem": "allreduce", "world_size": 4, "time_ms": 0.05})
    assert not roof.is_error
    floor = roof.structured_content["floor_ms"]
    assert floor > 0 and roof.structured_content["pct_of_floor"] == pytest.approx(100 * floor / 0.05)
    assert "floor" in text_of(roof)
    found = await client.call_tool("list_problems", {"text": "allgather_gemm"})
    assert {p["name"] for p in found.structured_content["problems"]} >= {"allgather_gemm"}
    none = await client.call_tool("list_problems", {"category": "no-such-category"})
    assert not none.is_error and none.structured_content["problems"] == []


# ---------------------------------------------------------------- MCP tasks (SEP-2663)


RUN_1 = {"problem": "1", "path": str(ROOT / "problems" / "001_allreduce.py"), "world_size": 2, "trials": 1}


async def test_a_client_without_the_tasks_extension_is_not_given_tasks(state):
    server, scheduler = make_server(state)
    async with Client(server) as c:
        r = await c.call_tool("run_correctness", {**RUN_1, "path": "/nonexistent.py"})
        assert r.is_error and "not a readable .py file under the server's roots" in r.content[0].text
    scheduler.stop()


async def test_a_refused_call_is_the_tool_s_error_even_for_a_tasks_client(state):
    server, scheduler = make_server(state)
    tasks = Tasks()
    async with Client(server, extensions=[tasks]) as c:
        r = await c.call_tool("run_correctness", {**RUN_1, "trials": 0})
        assert r.is_error and not tasks.handles
        listed = await c.call_tool("list_problems", {"text": "allreduce"})  # not a task tool: as before
        assert not listed.is_error and not tasks.handles
    scheduler.stop()


@pytest.mark.integration
async def test_a_tasks_client_gets_a_task_it_polls_to_the_tool_s_result(state):
    server, scheduler = make_server(state)
    tasks = Tasks()
    async with Client(server, extensions=[tasks]) as c:
        r = await c.call_tool("run_correctness", {**RUN_1, "device": "cpu", "sandbox": "process"})
    scheduler.stop()
    assert not r.is_error and r.structured_content["result"]["verdict"] == "pass"
    (handle,) = tasks.handles
    assert handle.status == "working" and handle.poll_interval_ms == 1000 and handle.ttl_ms
    assert handle.task_id == r.structured_content["job_id"], "a task is the job: job_status answers for it"
    last = tasks.polls[-1]
    assert last["status"] == "completed" and "all 2 ranks match the reference" in last["statusMessage"]


@pytest.mark.integration
async def test_a_task_is_cancelled_and_survives_a_restart_as_its_job_does(state):
    server, scheduler = make_server(state)
    cpu = {**RUN_1, "device": "cpu", "sandbox": "process"}
    async with Client(server, extensions=[Tasks()]) as c:
        hang = await c.session.call_tool(
            "run_correctness", {**cpu, "path": str(CANDIDATES / "hangs.py")}, allow_claimed=True
        )
        queued = await c.session.call_tool("run_correctness", cpu, allow_claimed=True)  # behind the hang
        assert isinstance(hang, TaskHandle) and isinstance(queued, TaskHandle)
        task = await cancel_task(c.session, hang.task_id)
        with anyio.fail_after(60):
            while task["status"] == "working":
                await anyio.sleep(0.2)
                task = await get_task(c.session, hang.task_id)
        assert task["status"] == "cancelled" and "tasks/cancel" in task["statusMessage"]
    scheduler.stop()
    server, scheduler = make_server(state)  # a new server on the same job store
    async with Client(server, extensions=[Tasks()]) as c:
        with anyio.fail_after(300):
            while (task := await get_task(c.session, queued.task_id))["status"] == "working":
                await anyio.sleep(0.2)
        assert task["status"] == "completed"
        assert task["result"]["structuredContent"]["result"]["verdict"] == "pass"
        with pytest.raises(MCPError, match="does not exist"):
            await get_task(c.session, "nosuchtask")
    scheduler.stop()


async def test_the_world_size_schema_asks_for_2_ranks_or_more_and_the_list_says_it_pages(client):
    """Issue 51: every problem needs 2 ranks, yet world_size's minimum was 1; list_problems said
    "all on one page" and pages at `limit`."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in ("get_reference", "run_correctness", "benchmark", "profile", "roofline"):
        assert tools[name].input_schema["properties"]["world_size"]["minimum"] == 2, name
    assert "one page" not in (tools["list_problems"].description or "")
    assert "page" in (tools["list_problems"].description or "")


@pytest.mark.parametrize(
    ("cli", "tool"),
    [
        ("raise it: pass --timeout 300", "raise it: pass timeout_s=300"),
        ("pass --world-size 2 or more", "pass world_size=2 or more"),
        ("problem 9 does not exist; see pkb problems", "problem 9 does not exist; see list_problems"),
    ],
)
def test_a_hint_names_the_tool_argument_a_client_can_pass(cli, tool):
    """The CLI's --timeout is the tools' timeout_s: a hint naming `timeout=` names no argument."""
    assert in_tool_words(cli) == tool
