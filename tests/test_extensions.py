"""Extensions a solution builds with load_inline, and everything that imports or compiles candidate
code: only ever inside the sandbox (Docker here, as on a GPU node), built once into the node's cache,
which no candidate's job can write. .ci/run starts a Docker engine (PKB_REQUIRE_DOCKER=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from harness import extensions as requests
from pkb_mcp import config, service
from pkb_mcp.frontends.server import build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.launches import ToolLaunches
from pkb_mcp.models import RunRequest
from sandbox import select_backend

from .conftest import CANDIDATES, docker_client

CLIENT = docker_client()
pytestmark = [pytest.mark.integration, pytest.mark.skipif(CLIENT is None, reason="no Docker engine answers")]
LAZY = CANDIDATES / "cpp_extension_lazy.py"
TOKEN = "PKB_PLANTED_SECRET_7f3a9c"


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A host secret a candidate would love to read, and a host path it would love to write."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"{TOKEN} = 1;\n")
    return secret, tmp_path / "written-by-candidate"


def hostile_solution(secret: Path, marker: Path) -> str:
    """Module-level code that reads the secret, writes the marker and the extension cache, and puts
    what it read in every message it can: exceptions, stdout, the extension's source."""
    return textwrap.dedent(
        f"""
        import os
        import torch
        import torch.distributed as dist
        from torch.utils.cpp_extension import load_inline

        try:
            LEAK = open({str(secret)!r}).read()
        except OSError as exc:
            LEAK = "unreadable: " + str(exc)
        print("leak:", LEAK)
        CACHE = os.environ.get("PKB_EXTENSIONS", "/nonexistent")
        for target in ({str(marker)!r}, os.path.join(CACHE, "evil")):
            try:
                with open(target, "w") as f:
                    f.write("written from candidate code")
            except OSError:
                pass
        CPP = "#include <torch/extension.h>\\n// " + LEAK.replace("\\n", " ") + "\\nint broken = ;\\n"
        _ext = None


        def solution(x):
            global _ext
            if _ext is None:
                _ext = load_inline(name="hostile_ext", cpp_sources=CPP, functions=["nothing"])
            raise RuntimeError("leak: " + LEAK)
        """
    ).lstrip("\n")


def assert_untouched(marker: Path, *outputs: str) -> None:
    assert not marker.exists(), "candidate code wrote a file on the host"
    assert not (config.extensions_dir() / "evil").exists(), "candidate code wrote into the extension cache"
    for text in outputs:
        assert TOKEN not in text, "candidate code read the planted host secret"


def test_pkb_compile_runs_the_candidate_only_in_the_sandbox(planted, tmp_path: Path) -> None:
    secret, marker = planted
    solution = tmp_path / "hostile.py"
    solution.write_text(hostile_solution(secret, marker))
    cuda = tmp_path / "includes_host_file.cu"
    cuda.write_text(
        f'#include "{secret}"\n#include "../{tmp_path.name}/host-secret.txt"\n__global__ void k() {{}}\n'
    )
    env = {**os.environ, "PKB_CACHE_DIR": str(config.cache_dir())}
    outputs = []
    for path in (solution, cuda):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pkb_mcp",
                "compile",
                str(path),
                "--sandbox",
                "docker",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert done.returncode == 1, done.stderr[-2000:]  # neither builds: the candidate failed, not pkb
        result = json.loads(done.stdout)
        assert result["sandbox"] == "docker"
        outputs.append(done.stdout + done.stderr)
    assert "does not name a type" in outputs[0] or "expected" in outputs[0]  # the C++ error, from the sandbox
    assert_untouched(marker, *outputs)


def test_every_mcp_tool_runs_the_candidate_only_in_the_sandbox(planted, tmp_path: Path) -> None:
    secret, marker = planted
    source = hostile_solution(secret, marker)

    async def main() -> list[str]:
        scheduler = Scheduler(JobStore(tmp_path / "state" / "jobs.sqlite"), gpus=0)
        server = build_server(scheduler, tmp_path / "state" / "sources")
        seen = []
        async with Client(server) as client:
            compiled = await client.call_tool("compile_kernel", {"source": source})
            assert compiled.structured_content["result"]["sandbox"] == "docker"
            cu = f'#include "{secret}"\n__global__ void k() {{}}\n'
            seen.append(
                json.dumps(
                    (
                        await client.call_tool("compile_kernel", {"source": cu, "language": "cuda"})
                    ).structured_content
                )
            )
            seen.append(json.dumps(compiled.structured_content))
            args = {"problem": 1, "source": source, "world_size": 2, "device": "cpu", "timeout_s": 120}
            for tool in ("run_correctness", "benchmark"):
                result = await client.call_tool(tool, args)
                full = result.structured_content
                assert full["state"] == "done" and full["result"]["verdict"] == "fail", full
                got = await client.call_tool("job_result", {"job_id": full["job_id"]})
                seen.append(json.dumps(got.structured_content))
        return seen

    assert_untouched(marker, *anyio.run(main))


def test_lazy_cpp_extension_is_built_once_and_rechecks_are_fast() -> None:
    first = service.check(
        RunRequest(problem=1, path=LAZY, world_size=2, device="cpu", trials=2, sandbox="docker")
    )
    assert first.verdict == "pass", first.message
    assert any("built extension pkb_test_copy" in n for n in first.notes), first.notes
    second = service.check(
        RunRequest(problem=1, path=LAZY, world_size=2, device="cpu", trials=2, sandbox="docker")
    )
    assert second.verdict == "pass", second.message
    assert any("loaded from the build cache" in n for n in second.notes), second.notes
    assert second.wall_s <= first.wall_s / 2, (first.wall_s, second.wall_s)
    # compile_kernel of the same source finds the lazy call and reuses the build
    compiled = service.compile_file(RunRequest(path=LAZY, sandbox="docker"))
    assert compiled.ok and len(compiled.units) == 1
    assert any("loaded from the build cache" in n for n in compiled.notes), compiled.notes


def test_an_undiscoverable_extension_is_built_in_the_job_once_for_all_ranks() -> None:
    result = service.check(
        RunRequest(
            problem=1,
            path=CANDIDATES / "cpp_extension_dynamic.py",
            world_size=2,
            device="cpu",
            trials=1,
            sandbox="docker",
        )
    )
    assert result.verdict == "pass", (result.message, [r.log_tail for r in result.ranks])
    assert not list(config.extensions_dir().iterdir()), "a candidate's own build never enters the cache"


def test_a_candidate_cannot_put_a_build_in_the_cache_for_others(tmp_path: Path) -> None:
    """The cache is written only by build jobs, from the request that names the entry: a job that
    tries to write it meets a read-only mount, and a forged entry cannot appear under another key."""
    tools = ToolLaunches(select_backend("docker"))
    request = requests.request_of("victim", "#include <torch/extension.h>\nint f() { return 1; }\n")
    forger = tmp_path / "forger.py"
    forger.write_text(
        textwrap.dedent(
            """
            import os, json
            cache = os.environ["PKB_EXTENSIONS"]
            try:
                os.makedirs(os.path.join(cache, "forged"))
                result = "wrote"
            except OSError as exc:
                result = type(exc).__name__
            print("cache write:", result)


            def solution(x):
                return x.clone()
            """
        )
    )
    found = service.compile_file(RunRequest(path=forger, sandbox="docker"))
    assert found.ok
    assert list(config.extensions_dir().iterdir()) == []
    from pkb_mcp.compile import extensions

    prepared, result = extensions.build_requests([request], tools, 300)
    assert prepared.built == ["victim"] and result is not None
    entry = config.extensions_dir() / request.key(extensions.toolchain())
    assert (entry / requests.OK_MARK).is_file() and (entry / "victim.so").is_file()
    assert os.stat(entry).st_uid == os.getuid()  # copied by the host, not left by a job


def test_failed_builds_are_kept_and_not_rebuilt() -> None:
    from pkb_mcp.compile import extensions

    tools = ToolLaunches(select_backend("docker"))
    broken = requests.request_of("broken_ext", "int broken = ;\n")
    first, _ = extensions.build_requests([broken], tools, 300)
    assert first.failed == ["broken_ext"]
    start = time.monotonic()
    again, result = extensions.build_requests([broken], tools, 300)
    assert again.failed == ["broken_ext"] and result is None and time.monotonic() - start < 1


def test_original_benchmark_helper_imports_in_the_sandbox() -> None:
    result = service.check(
        RunRequest(
            problem=1,
            path=CANDIDATES / "original_helper_cuda.py",
            world_size=2,
            device="cpu",
            trials=1,
            sandbox="docker",
        )
    )
    assert result.verdict == "pass", (result.message, [r.log_tail for r in result.ranks])


def test_a_precompiled_torch_header_is_made_apart_and_later_builds_compile_with_it(
    tmp_path, monkeypatch
) -> None:
    """The first build asks for its flags' header in a build launch of its own (no candidate source);
    the next build's C++ unit compiles with it (its source includes the header a second time, as
    agents' often do), and its object equals one compiled without it; `pkb compile`'s syntax check
    of a C++ source takes it too."""
    import threading

    from pkb_mcp.compile import compile_source, extensions, headers

    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "1")  # on by default; the suite's tests turn it off
    tools = ToolLaunches(select_backend("docker"))

    def request(name: str) -> requests.Request:
        source = "#include <torch/extension.h>\nint twice(int x) { return 2 * x; }"  # the header again
        return requests.Request(name=name, cpp_sources=(source,), functions=("twice",))

    first, _ = extensions.build_requests([request("pkb_test_one")], tools, 600)
    assert first.built == ["pkb_test_one"], first
    for thread in [t for t in threading.enumerate() if t.name == "headers"]:
        thread.join(600)
    made = list(headers.cache_root().glob("*/torch/extension.h.gch"))
    assert len(made) == 1 and made[0].stat().st_size > 1 << 20, made
    # without load_inline's own include the source is main.cpp as given: its header after a blank line
    bare = requests.Request(
        name="pkb_test_own",
        cpp_sources=("\n#include <torch/extension.h>\nint twice(int x) { return 2 * x; }",),
        functions=("twice",),
        no_implicit_headers=True,
    )
    second, _ = extensions.build_requests([request("pkb_test_two"), bare], tools, 600)
    assert second.built == ["pkb_test_two", "pkb_test_own"], second
    chain = extensions.toolchain()
    names = ("pkb_test_one", "pkb_test_two", "pkb_test_own")
    entries = {name: config.extensions_dir() / request(name).key(chain) for name in names[:2]}
    entries["pkb_test_own"] = config.extensions_dir() / bare.key(chain)
    for name in names[1:]:
        units = json.loads((entries[name] / requests.UNITS_MARK).read_text())
        assert [Path(p).name for p in units["precompiled"]] == ["main.cpp"], (name, units)
    assert json.loads((entries["pkb_test_one"] / requests.UNITS_MARK).read_text())["precompiled"] == []

    def symbols(name: str) -> list[str]:
        # the cache keeps a unit's library (its objects are the object cache's, where they are kept)
        nm = ["nm", str(entries[name] / f"{name}.so")]
        out = subprocess.run(nm, capture_output=True, text=True, check=True)
        return sorted(line.split()[-1].replace(name, "NAME") for line in out.stdout.splitlines())

    assert symbols("pkb_test_one") == symbols("pkb_test_two") == symbols("pkb_test_own")
    checked = LAZY.read_text().replace('CPP_SOURCE = """', 'CPP_SOURCE = """// checked')  # a new unit
    result = compile_source(checked, filename="checked.py", cache_dir=tmp_path / "compile", tools=tools)
    assert result.ok and "(with torch's precompiled header)" in result.units[0].log, result.units
