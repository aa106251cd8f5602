"""The node's extension cache on the host side (pkb_mcp/compile/extensions.py): which solutions need it,
which discovered load_inline calls become build requests, and what a build launch's results put into
the cache. A stand-in for the sandbox's tool launches writes what discovery and build would report;
tests/test_extensions.py runs the real ones in Docker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness import extensions as requests
from pkb_mcp import config
from pkb_mcp.compile import extensions

SOURCE = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"
SOLUTION = "from torch.utils.cpp_extension import load_inline\nEXT = load_inline('twice', [SRC])\n"


# the object key of an honest candidate's unit, which a hostile build launch plants an object under
PLANTED = requests.unit_keys(
    requests.Request(name="honest", cpp_sources=("int honest();",)), extensions.toolchain()
)["main.cpp"]


def call(name: str = "twice", **more: Any) -> dict[str, Any]:
    """A load_inline call as discovery records it."""
    return {"api": "load_inline", "name": name, "cpp_sources": [SOURCE], "functions": ["twice"], **more}


class StandInTools:
    """Tool launches that write what discovery and the build would report, and count themselves.
    `build` maps a request's name to "ok", "failed" or "missing" (no entry in the build's result)."""

    def __init__(
        self, calls: Any, build: dict[str, str] | None = None, isolated: bool = True, **discovered: Any
    ):
        self.calls, self.build, self.isolated, self.discovered = calls, build or {}, isolated, discovered
        self.runs: list[str] = []
        self.discover_timed_out = False

    def new_dir(self) -> Path:
        path = Path(config.launches_dir()) / f"tool-{len(self.runs)}-{os.urandom(4).hex()}"
        path.mkdir()
        return path

    def run(self, mode: str, launch_dir: Path, params: dict[str, Any], timeout_s: float) -> SimpleNamespace:
        self.runs.append(mode)
        if mode == "discover":
            if self.discover_timed_out:
                return SimpleNamespace(timed_out=True, log="")
            (launch_dir / "discovered.json").write_text(json.dumps({"calls": self.calls, **self.discovered}))
            return SimpleNamespace(timed_out=False, log="")
        chain = extensions.toolchain()
        entries = []
        for data in params["extensions"]:
            request = requests.Request.from_json(data)
            key, how = request.key(chain), self.build.get(request.name, "ok")
            if how == "ok":
                built = launch_dir / "extensions" / key
                built.mkdir(parents=True)
                (built / "twice.so").write_bytes(b"\x7fELF")
                (built / "escape").symlink_to("/etc/passwd")
                requests.write_mark(built, requests.OK_MARK, {})
                entries.append({"key": key, "ok": True})
                units = launch_dir / "objects"  # the units it compiled (harness/objects.py)
                units.mkdir(exist_ok=True)
                own = requests.unit_keys(request, chain)["main.cpp"]
                (units / f"{own}.o").write_bytes(b"\x7fELF object")
                # planted: another unit's key (computable from a known source), a stray name, a link
                (units / f"{PLANTED}.o").write_bytes(b"\x7fELF poisoned")
                (units / "stray.o").write_bytes(b"not named by a key")
                (units / f"{'b' * 64}.o").symlink_to("/etc/passwd")
            elif how == "failed":
                entries.append({"key": key, "ok": False, "log": "error: expected ';'"})
        (launch_dir / "build.json").write_text(json.dumps({"extensions": entries}))
        return SimpleNamespace(timed_out=False, log="")


def cache_entry(name_call: dict[str, Any]) -> Path:
    return config.extensions_dir() / requests.Request.from_json(name_call).key(extensions.toolchain())


def test_only_a_solution_that_could_build_an_extension_needs_the_cache():
    assert extensions.may_build(SOLUTION)
    assert extensions.may_build("from cuda_helpers import fused_kernel")
    assert not extensions.may_build("import torch\ndef solution(x):\n    return x\n")
    untouched = StandInTools([call()])
    assert extensions.prepare("def solution(x):\n    return x\n", untouched, 10.0).notes() == []
    assert untouched.runs == [], "no launch for a solution without extensions"


def test_discovered_calls_become_requests_without_trusting_them():
    assert extensions.parse_requests({"calls": []}) == ([], [])
    assert extensions.parse_requests(None) == ([], [])
    found, why = extensions.parse_requests(
        [
            "not a call",
            {"api": "load", "name": "other"},
            call(),
            call(),  # the same request twice is built once
            call("own_dir", build_directory="/tmp/x"),
            call("bad name"),
            call("flags", extra_cflags="-O3"),
        ]
    )
    assert [r.name for r in found] == ["twice"]
    assert why[0] == "extension own_dir: built inside the launch (it sets its own paths)"
    assert why[1].startswith("not prebuilt: extension name 'bad name' is not a Python identifier")
    assert why[2] == "not prebuilt: extra_cflags must be a list of strings"
    many, _ = extensions.parse_requests([call(f"ext{i}") for i in range(3 * extensions.MAX_REQUESTS)])
    assert len(many) == extensions.MAX_REQUESTS


def test_a_build_lands_in_the_cache_once_without_links_and_the_discovery_is_kept():
    tools = StandInTools([call()])
    first = extensions.prepare(SOLUTION, tools, 10.0)
    assert first.built == ["twice"] and tools.runs == ["discover", "build"]
    assert first.notes()[0].startswith("built extension twice in ")
    entry = cache_entry(call())
    assert (entry / requests.OK_MARK).is_file() and (entry / "twice.so").read_bytes() == b"\x7fELF"
    assert not (entry / "escape").exists() and not (entry / "escape").is_symlink(), "links stay behind"
    again = extensions.prepare(SOLUTION, tools, 10.0)
    assert tools.runs == ["discover", "build"], "an unchanged solution is neither imported nor built again"
    assert again.cached == ["twice"] and again.notes() == ["extension twice loaded from the build cache"]
    assert list(Path(config.launches_dir()).iterdir()) == [], "tool launch directories are removed"


def test_a_text_whose_builds_are_all_in_the_cache_is_built_already():
    tools = StandInTools([call()])
    assert not extensions.built_already(SOLUTION), "nothing discovered or built yet"
    assert not extensions.built_already("def solution(x):\n    return x\n"), "nothing to build"
    extensions.prepare(SOLUTION, tools, 10.0)
    assert extensions.built_already(SOLUTION), "its kept discovery names builds all in the cache"
    failing = StandInTools([call("other")], build={"other": "failed"})
    other = SOLUTION.replace("twice", "other")
    extensions.prepare(other, failing, 10.0)
    assert extensions.built_already(other), "a failure kept is not built again either"


def test_a_build_launch_s_objects_land_in_the_object_cache_only_under_its_own_units_keys():
    """The host installs only the object keys it computed for the request's own units: an object a
    build launch planted under another unit's key (an honest candidate's, computable from its source),
    a stray name and a link stay behind."""
    extensions.prepare(SOLUTION, StandInTools([call()]), 10.0)
    stored = sorted(p.name for p in (config.extensions_dir() / "objects").iterdir())
    own = requests.unit_keys(requests.Request.from_json(call()), extensions.toolchain())["main.cpp"]
    assert stored == [f"{own}.o"], "neither a planted key, a stray name nor a link is installed"
    assert (config.extensions_dir() / "objects" / stored[0]).read_bytes() == b"\x7fELF object"
    assert not (config.extensions_dir() / "objects" / f"{PLANTED}.o").exists()


def test_a_failed_build_is_kept_and_not_built_again():
    tools = StandInTools([call()], build={"twice": "failed"})
    first = extensions.prepare(SOLUTION, tools, 10.0)
    assert first.failed == ["twice"] and first.built == []
    assert first.notes()[0] == "extension twice failed to build: build: error: expected ';'"
    failure = json.loads((cache_entry(call()) / requests.FAILED_MARK).read_text())
    assert "expected ';'" in json.dumps(failure)
    again = extensions.prepare(SOLUTION, tools, 10.0)
    assert again.failed == ["twice"] and tools.runs == ["discover", "build"]


def test_a_build_that_left_no_result_leaves_the_build_to_the_launch():
    tools = StandInTools([call()], build={"twice": "missing"})
    prepared = extensions.prepare(SOLUTION, tools, 10.0)
    assert prepared.built == [] and prepared.failed == []
    assert prepared.skipped == ["extension twice: the build launch left no result; the launch builds it"]
    assert not cache_entry(call()).exists()


def test_only_isolated_build_launches_fill_the_cache():
    tools = StandInTools([call()], isolated=False)
    prepared = extensions.prepare(SOLUTION, tools, 10.0)
    assert tools.runs == ["discover"]
    assert prepared.skipped and "the cache is filled only by isolated build launches" in prepared.skipped[0]
    assert not cache_entry(call()).exists()


def test_flags_off_the_allow_list_are_never_built_for_the_shared_cache():
    risky = call("linked", extra_ldflags=["-Wl,-rpath,/tmp/evil"])
    tools = StandInTools([risky])
    prepared = extensions.prepare(SOLUTION, tools, 10.0)
    assert tools.runs == ["discover"]
    (skipped,) = prepared.skipped
    assert skipped.startswith("extension linked is built inside each launch: flag '-Wl,-rpath,/tmp/evil'")


def test_a_discovery_that_timed_out_or_failed_is_not_kept():
    slow = StandInTools([call()])
    slow.discover_timed_out = True
    prepared = extensions.prepare(SOLUTION, slow, 7.0)
    assert prepared.skipped == [
        "extensions not prebuilt: timed out: importing the solution did not finish within 7 s"
    ]
    failing = StandInTools([call()], error="ImportError: no module named cuda_helpers")
    extensions.prepare(SOLUTION, failing, 10.0)
    extensions.prepare(SOLUTION, failing, 10.0)
    assert failing.runs.count("discover") == 2, "a failed import is imported again next time"


@pytest.mark.parametrize(
    ("prepared", "notes"),
    [
        (extensions.Prepared(), []),
        (
            extensions.Prepared(built=["a", "b"], build_s=12.34),
            ["built extension a, b in 12.3 s (cached for re-runs)"],
        ),
        (
            extensions.Prepared(
                built=["a", "b"],
                build_s=20.04,
                units={"a": {"cuda.cu": 18.24, "main.cpp": 12.0, "(link)": 1.06}, "b": {"(link)": 0.5}},
            ),
            [
                "built extension a, b in 20.0 s (cached for re-runs; a: cuda.cu 18.2 s and main.cpp 12.0 s "
                "side by side, then the link 1.1 s; b: the link 0.5 s)"
            ],
        ),
        (
            extensions.Prepared(cached=["c"], failed=["d"], skipped=["why"]),
            [
                "extension c loaded from the build cache",
                "extension d failed to build (its compiler output names no error)",
                "why",
            ],
        ),
    ],
)
def test_what_preparing_did_reads_as_notes(prepared, notes):
    assert prepared.notes() == notes


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        (
            {"cached": [], "compiled": ["x"], "seconds": {"main.cpp": 3.5, "(link)": 0.4}},
            {"main.cpp": 3.5, "(link)": 0.4},
        ),
        ({"seconds": {"a.cu": "9", "b.cu": True, "c.cu": -1, "d.cu": 1e9, "e.cu": 2}}, {"e.cu": 2}),
        ({"seconds": [1, 2]}, {}),
        ([1, 2], {}),
        ({"seconds": {f"u{i}.cu": 1.0 for i in range(100)}}, {f"u{i}.cu": 1.0 for i in range(16)}),
    ],
)
def test_a_build_s_unit_times_are_read_as_untrusted(tmp_path, written, kept):
    """units.json is written inside the build launch: only names with plausible seconds are kept."""
    (tmp_path / "units.json").write_text(json.dumps(written))
    assert extensions.unit_seconds(tmp_path) == kept


def test_a_units_mark_too_large_or_not_json_is_no_report(tmp_path):
    (tmp_path / "units.json").write_text("{" + " " * extensions.UNITS_CAP + "}")
    assert extensions.unit_seconds(tmp_path) == {}
    (tmp_path / "units.json").write_text("not json")
    assert extensions.unit_seconds(tmp_path) == {}
    assert extensions.unit_seconds(tmp_path / "missing") == {}


def test_a_header_a_build_launch_made_is_installed_only_as_a_plain_file_under_its_key(tmp_path, monkeypatch):
    from harness import headers as made_headers
    from pkb_mcp.compile import headers
    from sandbox.untrusted import LaunchFiles

    made = tmp_path / "headers"
    good, link, big, unasked = "a" * 64, "b" * 64, "c" * 64, "d" * 64
    for key in (good, big, "not-a-key", unasked):
        path = made_headers.path(made, key)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"gch" * (10 if key == big else 1))
    made_headers.path(made, link).parent.mkdir(parents=True)
    made_headers.path(made, link).symlink_to("/etc/passwd")
    monkeypatch.setattr(headers, "MAX_HEADER_BYTES", 20)
    asked = [good, link, big, "not-a-key"]  # the keys of the flag sets the host asked for
    assert headers.install(LaunchFiles(tmp_path), asked) == 1
    installed = sorted(p.name for p in headers.cache_root().iterdir())
    placed = made_headers.path(headers.cache_root(), good)
    assert installed == [good] and placed.read_bytes() == b"gch"
    stub = placed.with_suffix("").read_text()  # written by the host, not taken from the launch
    assert stub.startswith('#include "/') and stub.rstrip().endswith('/torch/extension.h"'), stub
    assert headers.install(LaunchFiles(tmp_path), asked) == 0, "a header already there stays"


def test_a_flag_set_s_header_is_asked_for_once_in_isolated_sandboxes_only(monkeypatch):
    from pkb_mcp.compile import headers

    asked: list = []

    class Tools:
        isolated = True

        def new_dir(self) -> Path:
            path = Path(config.launches_dir()) / f"tool-{os.urandom(4).hex()}"
            path.mkdir()
            return path

        def run(self, mode, launch_dir, params, timeout_s):
            asked.append(params)
            (launch_dir / "build.json").write_text(json.dumps({"headers": [{"key": "k", "ok": True}]}))

    monkeypatch.setattr(headers, "_asked", set())
    wanted = [{"extra_cflags": ["-O3"], "with_cuda": False}]
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "0")
    assert headers.prepare_soon(wanted, Tools()) is None, "turned off"
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "1")
    thread = headers.prepare_soon(wanted, Tools())
    assert thread is not None
    thread.join(10)
    assert asked == [{"headers": wanted}]
    assert headers.prepare_soon(wanted, Tools()) is None, "asked once per process"
    unisolated = Tools()
    unisolated.isolated = False
    assert headers.prepare_soon([{"extra_cflags": [], "with_cuda": True}], unisolated) is None
    assert list(Path(config.launches_dir()).iterdir()) == []


def test_a_header_the_cache_has_or_no_launch_could_see_is_not_made(tmp_path, monkeypatch):
    """A later process (a command line's next run) finds the header its cache holds and asks for none;
    nor is one made where launch directories lie on another file system than the cache, whose view
    could only copy smaller entries (pkb_mcp/extension_view.py VIEW_COPY_CAP)."""
    from harness import headers as made_headers
    from pkb_mcp.compile import headers

    class Tools:
        isolated = True

        def new_dir(self) -> Path:
            raise AssertionError("no launch was wanted")

    monkeypatch.setattr(headers, "_asked", set())
    monkeypatch.setenv("PKB_PRECOMPILED_HEADERS", "1")
    wanted = {"extra_cflags": [], "with_cuda": False}
    key = made_headers.key([], False, extensions.toolchain())
    found = made_headers.path(headers.cache_root(), key)
    found.parent.mkdir(parents=True)
    found.write_bytes(b"gch")
    assert headers.in_cache(wanted) and not headers.in_cache({**wanted, "extra_cflags": ["-O3"]})
    assert headers.prepare_soon([wanted], Tools()) is None
    elsewhere = Path("/dev/shm")
    if not elsewhere.is_dir() or os.stat(elsewhere).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here")
    monkeypatch.setenv("PKB_LAUNCH_DIR", str(elsewhere))
    assert headers.prepare_soon([{**wanted, "extra_cflags": ["-O3"]}], Tools()) is None


def test_a_cpu_node_asks_for_the_c_plus_plus_set_alone_and_a_check_for_its_build_s(monkeypatch):
    """Where torch has no CUDA, the default sets and a syntax check's set leave CUDA out: no CUDA unit
    is built there, and a set with CUDA would cost a header no build uses."""
    import torch

    from pkb_mcp.compile import headers

    monkeypatch.setattr(torch.version, "cuda", None)
    assert headers.default_sets() == [{"extra_cflags": [], "with_cuda": False}]
    both = requests.Request(name="x", cpp_sources=("int f();",), cuda_sources=("__global__ void k() {}",))
    assert headers.check_set(both) == {"extra_cflags": [], "with_cuda": False}
    chain = extensions.toolchain()
    assert headers.check_key(both, chain) == requests.header_key(
        requests.Request(name="y", cpp_sources=("int f();",)), chain
    ), "the C++ set's header, which a build of a C++ extension asks for"
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert {"extra_cflags": [], "with_cuda": True} in headers.default_sets()
    assert headers.check_set(both)["with_cuda"] is True


def test_a_build_launchs_steps_are_logged_from_its_record_with_limits() -> None:
    """Where a build launch's time went comes from build.json, written in the sandbox: numbers out
    of range, wrong types and extra keys are dropped."""
    record = {
        "import_s": 2.5,
        "extensions": [
            {"name": "ext", "elapsed_s": 18.0, "steps_s": {"plan": 0.4, "compile": 17.5, "x": 1}},
            {"name": "odd", "elapsed_s": True, "steps_s": {"plan": -1, "compile": "9"}},
            "not an entry",
        ],
    }
    steps = extensions.build_steps(record, 21.25)
    assert steps == {
        "launch": 21.25,
        "import": 2.5,
        "ext": {"plan": 0.4, "compile": 17.5, "elapsed": 18.0},
        "odd": {},
    }
    assert extensions.build_steps(None, 3.0) == {"launch": 3.0}
    assert extensions.build_steps({"import_s": 1e9, "extensions": {}}, 3.0) == {"launch": 3.0}


def test_a_launch_is_shown_only_its_own_entries_and_cannot_change_them(tmp_path):
    """show_entries links the entries of the launch's own keys into its view, nothing else; the view
    stays the host's through the hand-over (no chown, no chmod of the cache's inodes)."""
    from pkb_mcp import extension_view
    from sandbox.docker import DockerBackend

    own, other = "a" * 64, "b" * 64
    for key in (own, other):
        (config.extensions_dir() / key).mkdir()
        (config.extensions_dir() / key / "ext.so").write_bytes(key.encode())
        (config.extensions_dir() / key / requests.OK_MARK).write_text("{}")
        os.chmod(config.extensions_dir() / key / "ext.so", 0o444)
    launch_dir = tmp_path / "launch"
    launch_dir.mkdir()
    entries = extension_view.extension_entries([own, "../x", "not-a-key"])
    shown = extension_view.show_entries(launch_dir, entries)
    view = launch_dir / requests.VIEW
    assert shown == 2 and sorted(p.name for p in view.iterdir()) == [own]
    assert (view / own / "ext.so").read_bytes() == own.encode()
    before = os.stat(config.extensions_dir() / own / "ext.so")
    DockerBackend._hand_over(launch_dir)
    after = os.stat(config.extensions_dir() / own / "ext.so")
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode), "the cache's inode untouched"
    assert not os.stat(view / own / "ext.so").st_mode & 0o022, "nobody else may write it"
    assert not os.stat(view).st_mode & 0o022 and os.stat(view).st_uid == os.getuid()
