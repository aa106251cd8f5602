"""The MCP surface gives nothing of the host away (issue 49, item 6): a tool's `path` names only a file
under the server's roots (its working directory, or `--root` / PKB_ROOTS, and its state folder), every
refused path gets the same sentence, the file is read once into the server's own copy, and no error
repeats more than 64 characters of an id or name the client sent.

Fast tier: no job runs (the scheduler's submit is replaced by a list that keeps the requests)."""

import os
import re
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from pkb_mcp import config
from pkb_mcp.errors import ECHO_CHARS, UserError
from pkb_mcp.frontends import cli
from pkb_mcp.frontends.server import build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import run

from .conftest import ROOT

pytestmark = pytest.mark.anyio
SOLUTION = (ROOT / "problems" / "001_allreduce.py").read_text()  # the reference: a valid solution
LONG = "f" * 100_000


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def host(tmp_path):
    """A root with a solution in it, and a secret .py beside the root, outside it."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "001_allreduce.py").write_text(SOLUTION)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("TOKEN = 'the host secret'\n")
    return root, outside / "secret.py"


class Server:
    """A server over `roots` whose tools start nothing: a job they submit is stored, queued, and never
    run; its request is kept in `submitted` too."""

    def __init__(self, state, roots):
        self.scheduler = Scheduler(JobStore(state / "jobs.sqlite"), gpus=0)
        self.submitted: list[tuple[str, RunRequest]] = []
        self.scheduler.submit = self.submit
        self.mcp = build_server(self.scheduler, state / "sources", roots)

    def submit(self, kind, request, *more, **kw):
        job_id = f"job{len(self.submitted)}"
        self.scheduler.store.create(job_id, kind, request.model_dump(mode="json"))
        self.submitted.append((kind, request))
        return job_id


@pytest.fixture
async def server(tmp_path, host):
    s = Server(tmp_path / "state", [host[0]])
    yield s
    s.scheduler.stop()


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


def refused_paths(tmp_path, root, secret):
    """Every kind of path a client may name that the server must not read, each under a name of its own."""
    (root / "notes.md").write_text("# not a solution\n")
    (root / "folder.py").mkdir()
    os.mkfifo(root / "fifo.py")
    (root / "link.py").symlink_to(secret)  # inside the root, pointing out of it
    (root / "dev.py").symlink_to("/dev/zero")
    (root / "hidden.py").write_text(SOLUTION)
    (root / "hidden.py").chmod(0)
    paths = {
        "missing": str(root / "nothing.py"),
        "missing outside": "/nonexistent/sol.py",
        "outside": str(secret),
        "dot-dot": str(root / ".." / "outside" / "secret.py"),
        "not .py": str(root / "notes.md"),
        "a folder": str(root / "folder.py"),
        "a FIFO": str(root / "fifo.py"),
        "a link out": str(root / "link.py"),
        "a device": str(root / "dev.py"),
        "a host file": "/etc/passwd",
        "a NUL byte": str(root / "a\0.py"),
    }
    if os.geteuid() != 0:  # root reads a file of mode 0 all the same
        paths["unreadable"] = str(root / "hidden.py")
    return paths


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("run_correctness", {"problem": "1", "world_size": 2}),
        ("compile_kernel", {}),
        ("profile", {"problem": 1}),
    ],
)
async def test_every_refused_path_gets_one_sentence_and_queues_nothing(server, host, tmp_path, tool, args):
    root, secret = host
    answers = {}
    async with Client(server.mcp) as c:
        for why, path in refused_paths(tmp_path, root, secret).items():
            with anyio.fail_after(10):  # a FIFO must not hang the call
                result = await c.call_tool(tool, {**args, "path": path})
            assert result.is_error, why
            answers[why] = text_of(result)
    sentences = set(answers.values())
    assert len(sentences) == 1, f"the answer tells paths apart: {answers}"
    (sentence,) = sentences
    assert sentence.startswith("path is not a readable .py") and str(root) in sentence, sentence
    assert "source" in sentence and "--root" in sentence and "\n" not in sentence
    assert "secret" not in sentence and "host secret" not in sentence
    assert server.submitted == []


async def test_a_file_under_a_root_is_read_once_into_the_server_s_copy(server, host, tmp_path):
    """The job reads the server's copy, kept under the file's own name (pairing reads it): the client's
    file replaced afterwards by a link to a host secret changes nothing the job reads."""
    root, secret = host
    given = root / "001_allreduce.py"
    async with Client(server.mcp) as c:
        result = await c.call_tool(
            "run_correctness", {"problem": "1", "path": str(given), "world_size": 2, "wait": False}
        )
        assert not result.is_error, text_of(result)
        relative = await c.call_tool("compile_kernel", {"path": os.path.relpath(given), "wait": False})
        assert not relative.is_error, "a relative path is the server's working directory's"
    (kind, request), (_, compiled) = server.submitted
    copy = Path(request.path)
    assert kind == "check" and copy.name == "001_allreduce.py"
    assert copy.is_relative_to((tmp_path / "state" / "sources").resolve()), copy
    assert compiled.path == request.path, "the same bytes, the same copy"
    given.unlink()
    given.symlink_to(secret)
    assert copy.read_text() == SOLUTION


async def test_the_state_folder_is_always_a_root_and_the_working_directory_is_the_default(
    tmp_path, host, monkeypatch
):
    root, secret = host
    monkeypatch.chdir(root)
    monkeypatch.delenv("PKB_ROOTS", raising=False)
    s = Server(tmp_path / "state", None)  # the default: the working directory, and the state folder
    kept = tmp_path / "state" / "mine.py"
    kept.write_text(SOLUTION)
    async with Client(s.mcp) as c:
        for path in ("001_allreduce.py", str(root / "001_allreduce.py"), str(kept)):
            assert not (await c.call_tool("compile_kernel", {"path": path, "wait": False})).is_error, path
        assert (await c.call_tool("compile_kernel", {"path": str(secret)})).is_error
    assert len(s.submitted) == 3
    s.scheduler.stop()


def test_roots_come_from_serve_s_option_else_pkb_roots_else_the_working_directory(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(b)
    monkeypatch.delenv("PKB_ROOTS", raising=False)
    assert config.mcp_roots() == (b,)
    monkeypatch.setenv("PKB_ROOTS", f"{tmp_path / 'link'}{os.pathsep}{b}")
    assert config.mcp_roots() == (a, b), "resolved, in order"
    assert config.mcp_roots([str(b)]) == (b,), "--root replaces PKB_ROOTS"
    with pytest.raises(UserError, match=r"--root names .*nope, which is not a folder"):
        config.mcp_roots([str(tmp_path / "nope")])
    monkeypatch.setenv("PKB_ROOTS", str(tmp_path / "nope"))
    with pytest.raises(UserError, match="PKB_ROOTS names"):
        config.mcp_roots()


def test_serve_refuses_a_root_that_is_not_a_folder_before_it_starts(tmp_path, capsys):
    assert cli.main(["serve", "--no-warm", "--root", str(tmp_path / "nope")]) == cli.EXIT_USAGE
    assert "--root names" in capsys.readouterr().err


def longest_run_of_f(text):
    return max((len(m) for m in re.findall("f+", text)), default=0)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("job_status", {"job_id": LONG}),
        ("job_result", {"job_id": LONG}),
        ("cancel_job", {"job_id": LONG}),
        ("get_reference", {"problem": LONG}),
        ("roofline", {"problem": LONG}),
        ("run_correctness", {"problem": "f" * 4000, "source": SOLUTION}),
        ("roofline", {"problem": "1", "size": LONG}),
    ],
    ids=["job_status", "job_result", "cancel_job", "get_reference", "roofline", "run_correctness", "size"],
)
async def test_no_error_repeats_more_than_64_characters_of_an_id(server, tool, args):
    async with Client(server.mcp) as c:
        result = await c.call_tool(tool, args)
    assert result.is_error
    assert 0 < longest_run_of_f(text_of(result)) <= ECHO_CHARS, text_of(result)[:200]
    assert len(text_of(result)) < 400


@pytest.mark.parametrize(
    "uri",
    [
        f"pkb://jobs/{LONG}/result",
        f"pkb://jobs/{LONG}/trace",
        f"pkb://jobs/{LONG}/timeline",
        f"problem://{LONG}/reference",
    ],
    ids=["result", "trace", "timeline", "reference"],
)
async def test_no_resource_error_repeats_more_than_64_characters_of_an_id(server, uri):
    async with Client(server.mcp) as c:
        with pytest.raises(MCPError) as raised:
            await c.read_resource(uri)
    said = f"{raised.value.message} {raised.value.data}"  # the SDK's data repeats the URI too
    assert 0 < longest_run_of_f(said) <= ECHO_CHARS and len(said) < 400, said[:200]


def test_a_folder_swapped_for_a_link_after_the_check_is_still_refused(host, monkeypatch):
    """Between resolving the path and opening it, a folder under the root becomes a link out of it
    (resolution is made to miss it here): the path of the file opened is compared again."""
    root, secret = host
    (root / "sub").symlink_to(secret.parent)
    monkeypatch.setattr(run.os.path, "realpath", lambda path: str(path))
    with pytest.raises(UserError, match=r"not a readable \.py file under the server's roots"):
        run.read_confined(str(root / "sub" / "secret.py"), [root], (".py",), 1 << 20)
    assert (
        run.read_confined(str(root / "001_allreduce.py"), [root], (".py",), 1 << 20)[1] == SOLUTION.encode()
    )


def test_an_unknown_task_id_is_echoed_at_most_64_characters():
    """tasks/get and tasks/cancel name the task they cannot find as every other error does."""
    from types import SimpleNamespace

    from pkb_mcp.frontends.tasks import TasksExtension

    def unknown(job_id):
        raise UserError("no such job")

    tasks = TasksExtension(SimpleNamespace(scheduler=SimpleNamespace(get=unknown)))  # type: ignore[arg-type]
    with pytest.raises(MCPError) as raised:
        tasks._record("f" * 100_000)
    said = str(raised.value)
    assert 0 < longest_run_of_f(said) <= ECHO_CHARS and len(said) < 200, said[:200]
