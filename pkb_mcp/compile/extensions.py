"""The node's extension cache: what a solution builds with `load_inline`, built once, before its launches run.

Before a check or benchmark (and in `compile_kernel`) the host:

1. finds the solution's extension builds: from its text where the text alone fixes every call
   (compile/literal_calls.py, a run's common case: module-level source strings), else with a discovery
   launch (harness/discover.py: the candidate is imported inside the sandbox; lazy calls on
   solution()'s first call are found too; compile_kernel always launches it, to check the import).
   What either reports is untrusted data: parsed with limits, and only ever used as build requests.
   Discoveries are kept per solution text, so an unchanged solution is not imported again;
2. keys each request (harness/extensions.py: sources, flags, toolchain) and, for those not in the cache
   whose flags pass the compile allow-list, runs a build launch (harness/build.py): torch's build with no
   candidate code, whose output is therefore a function of the request alone;
3. copies each built extension (its library and marks, plain files read through sandbox/untrusted.py)
   into `config.extensions_dir()` under its key, and the objects of the units the build compiled into
   its `objects/` folder (harness/objects.py: a unit already there is not compiled again), but only
   under keys the host computed itself for the requests it asked for (harness/extensions.py
   `unit_keys`): whatever else a build launch left is never installed. A build launch sees only the
   object, header and part entries of its own requests' steps; a candidate's launch only the entries
   of its own requests (pkb_mcp/extension_view.py `show_entries`); `load_inline` loads from there and builds
   only what it does not find.

The build launch is treated as candidate code in every respect: its steps run no shell, its flags are
plain by grammar (compile/flags.py), and what it leaves is read untrusted. So a candidate's own launch
never writes to the cache, and another tenant's launch loads only what a build launch made from the
request that names it (docs/sandbox.md). Failed builds are kept too (with the
compiler's output), so a re-check of a source that does not compile does not compile it again.

Offers `prepare` (steps 1 to 3 for a run; `may_build` says whether a text needs it, `built_already`
whether its text names only builds in the cache), `Prepared` (what
it did), and the steps themselves for compile_kernel, which adds its compiler runs to the build launch:
`discover`, `parse_requests`, `build_requests`, `toolchain`. `ToolRunner` is what runs the discovery and
build launches (pkb_mcp.launches.ToolLaunches). A build also asks for its flags' precompiled torch
header, and its CUDA units' precompiled headers' parts, for the builds after it (compile/headers.py),
and a build whose CUDA unit parses torch's headers says in its notes how the same kernel rebuilds in
other structures (`rebuild_advice`: an edit compiles the CUDA unit again, the C++ unit is cached).
Imports pkb_mcp.config, log, launches and compile.flags, headers, literal_calls, parse,
harness.extensions, objects and sandbox.toolchain.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness import extensions as requests
from harness import objects
from pkb_mcp import config
from pkb_mcp.compile.flags import prebuild_refusal
from pkb_mcp.compile.headers import (
    flag_set,
    header_entries,
    part_entries,
    prepare_parts_soon,
    prepare_soon,
    remember_part,
)
from pkb_mcp.compile.literal_calls import literal_calls
from pkb_mcp.compile.parse import first_errors
from pkb_mcp.extension_view import show_entries
from pkb_mcp.launches import read_result, seconds
from pkb_mcp.log import get
from sandbox.toolchain import jit_env
from sandbox.untrusted import LaunchFiles

log = get(__name__)

MAX_REQUESTS = 16
MAX_OBJECTS = 4 * MAX_REQUESTS  # objects one build launch may add to the cache (each request: 2 units)
MAX_OBJECT_BYTES = 256 << 20
MAX_LIBRARY_BYTES = 1 << 30  # an extension's shared library
MARK_BYTES = 1 << 20
DISCOVERY_SCHEMA = 1
DISCOVERY_CAP = 16 << 20
TIMED_OUT = "timed out"


class ToolRunner(Protocol):
    """Runs harness tool programs as sandbox launches (pkb_mcp.launches.ToolLaunches)."""

    isolated: bool

    def new_dir(self) -> Path: ...

    def run(self, mode: str, launch_dir: Path, params: dict[str, Any], timeout_s: float) -> Any: ...


@dataclass
class Prepared:
    """What preparing a solution's extensions did, for the result's notes."""

    built: list[str] = field(default_factory=list)  # names built now
    cached: list[str] = field(default_factory=list)  # names already in the cache
    failed: list[str] = field(default_factory=list)  # names whose build failed (the launch reports why)
    skipped: list[str] = field(default_factory=list)  # why a request is left to the launch to build
    build_s: float = 0.0
    requests: list[requests.Request] = field(default_factory=list)  # every build the solution asks for
    logs: dict[str, str] = field(default_factory=dict)  # a failed build's compiler output, by name
    units: dict[str, dict[str, float]] = field(default_factory=dict)  # a build's seconds per unit, by name
    advice: list[str] = field(default_factory=list)  # how a build just made would rebuild faster

    def notes(self) -> list[str]:
        out = []
        if self.built:
            each = "".join(f"; {n}: {units_text(self.units[n])}" for n in self.built if self.units.get(n))
            out.append(
                f"built extension {', '.join(self.built)} in {self.build_s:.1f} s (cached for re-runs{each})"
            )
        if self.cached:
            out.append(f"extension {', '.join(self.cached)} loaded from the build cache")
        for name in self.failed:
            errors = first_errors(self.logs.get(name, ""), limit=1)
            why = f": {errors[0].one_line()}" if errors else " (its compiler output names no error)"
            out.append(f"extension {name} failed to build{why}")
        out += self.skipped
        return out + self.advice


UNITS_CAP = 8192


def unit_seconds(directory: Path) -> dict[str, float]:
    """How long each unit a build compiled took, and its link (harness/objects.py), from the build's
    units mark: written in the sandbox, so only short names and plausible numbers are kept."""
    found = read_result(directory / requests.UNITS_MARK, UNITS_CAP)
    each = found.get("seconds") if isinstance(found, dict) else None
    if not isinstance(each, dict):
        return {}
    kept = {str(name)[:80]: seconds(value) for name, value in list(each.items())[:16]}
    return {name: value for name, value in kept.items() if value is not None}


def units_text(seconds: dict[str, float]) -> str:
    """`cuda.cu 18.2 s and main.cpp 12.0 s side by side, then the link 1.1 s`."""
    units = [f"{name} {s:.1f} s" for name, s in seconds.items() if name != objects.LINK]
    text = " and ".join(units) + (" side by side" if len(units) > 1 else "")
    if objects.LINK in seconds:
        link = f"the link {seconds[objects.LINK]:.1f} s"
        text = f"{text}, then {link}" if units else link
    return text


def toolchain() -> dict[str, str]:
    """The toolchain key part, as every launch sees it (same interpreter, same /usr, same variables)."""
    return requests.toolchain({**os.environ, **jit_env()})


def _entry_state(key: str) -> str | None:
    directory = config.extensions_dir() / key
    if (directory / requests.OK_MARK).is_file():
        return "ok"
    if (directory / requests.FAILED_MARK).is_file():
        return "failed"
    return None


def parse_requests(calls: Any) -> tuple[list[requests.Request], list[str]]:
    """The load_inline requests in a discovery's recorded calls; and why others are not prebuilt."""
    found: list[requests.Request] = []
    why: list[str] = []
    if not isinstance(calls, list):
        return found, why
    for call in calls[: 4 * MAX_REQUESTS]:
        if not isinstance(call, dict) or call.get("api") != "load_inline":
            continue
        if call.get("build_directory") or call.get("extra_include_paths"):
            name = str(call.get("name"))[:40]
            why.append(f"extension {name}: built inside the launch (it sets its own paths)")
            continue
        try:
            request = requests.Request.from_json(call)
        except requests.RequestError as exc:
            why.append(f"not prebuilt: {exc}")
            continue
        if request not in found:
            found.append(request)
    return found[:MAX_REQUESTS], why


def _kept_discovery(text: str) -> tuple[Path, Any]:
    """Where a text's discovery is kept, and what is kept there (None: nothing readable)."""
    digest = hashlib.sha256(json.dumps([DISCOVERY_SCHEMA, text, toolchain()]).encode()).hexdigest()
    kept = config.cache_dir() / "discovery" / f"{digest}.json"
    return kept, read_result(kept, DISCOVERY_CAP)


def discover(text: str, tools: ToolRunner, timeout_s: float) -> dict[str, Any] | str:
    """The discovery of a solution's text (kept per text); a string says why it failed."""
    kept, found = _kept_discovery(text)
    if isinstance(found, dict):
        return found
    launch_dir = tools.new_dir()
    try:
        src = launch_dir / "src"
        src.mkdir()
        solution = src / "solution.py"
        solution.write_text(text, encoding="utf-8")
        outcome = tools.run("discover", launch_dir, {"solution_path": str(solution)}, timeout_s)
        found = read_result(launch_dir / "discovered.json", DISCOVERY_CAP)
        if outcome.timed_out and not isinstance(found, dict):
            return f"{TIMED_OUT}: importing the solution did not finish within {timeout_s:.3g} s"
        if not isinstance(found, dict):
            return f"importing the solution failed before it finished: {outcome.log[-1500:].strip()}"
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)
    if found.get("error") is None:  # a failed import is not kept: the cause may be passing
        _store(kept, found)
    return found


def _store(path: Path, value: Any) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
        part.write_text(json.dumps(value))
        os.replace(part, path)


def build_requests(
    wanted: list[requests.Request],
    tools: ToolRunner,
    timeout_s: float,
    extra: dict[str, Any] | None = None,
    launch_dir: Path | None = None,
) -> tuple[Prepared, dict[str, Any] | None]:
    """Build the requests that are not in the cache, with `extra` commands (compile_kernel's compiler
    runs) in the same build launch, in `launch_dir` if given (where the caller wrote their sources; the
    caller removes it). Returns what happened and the build launch's result (harness/build.py), or None
    when no launch ran or it left no readable result."""
    prepared = Prepared()
    chain = toolchain()
    todo: list[tuple[str, requests.Request]] = []
    for request in wanted:
        key = request.key(chain)
        state = _entry_state(key)
        if state == "ok":
            prepared.cached.append(request.name)
        elif state == "failed":
            prepared.failed.append(request.name)
            kept = requests.read_mark(config.extensions_dir() / key, requests.FAILED_MARK) or {}
            prepared.logs[request.name] = str(kept.get("log", ""))
        elif (refusal := prebuild_refusal(request)) is not None:
            prepared.skipped.append(f"extension {request.name} is built inside each launch: {refusal}")
        elif tools.isolated:
            todo.append((key, request))
        else:
            prepared.skipped.append(
                f"extension {request.name} is built inside the launch: the cache is filled only by isolated "
                "build launches (Docker)"
            )
    # this flag set's precompiled header, for the builds after this one (compile/headers.py)
    prepare_soon([flag_set(r) for _, r in todo], tools)
    if not todo and not (extra and extra.get("commands")):
        return prepared, None
    own_dir = launch_dir is None
    launch_dir = launch_dir or tools.new_dir()
    try:
        params = {"extensions": [r.to_json() for _, r in todo], **(extra or {})}
        unit_objects = [key for _, r in todo for key in requests.unit_keys(r, chain).values()]
        show_entries(launch_dir, build_entries([r for _, r in todo], chain))
        start = time.monotonic()
        outcome = tools.run("build", launch_dir, params, timeout_s)
        prepared.build_s = time.monotonic() - start
        result = read_result(launch_dir / "build.json")
        files = LaunchFiles(
            launch_dir, budget=(len(todo) + 1) * MAX_LIBRARY_BYTES + MAX_OBJECTS * MAX_OBJECT_BYTES
        )
        _install_results(todo, result, outcome.timed_out, files, prepared)
        prepared.advice = [a for _, r in todo if r.name in prepared.built and (a := rebuild_advice(r))]
        _install_objects(files, unit_objects)
        # the CUDA units' headers' parts the cache lacked, for the builds after this one
        unmade = unmade_parts(result, dict(todo))
        for key, request in reported_parts(result, dict(todo)).items():
            remember_part(request, key, chain)
        prepare_parts_soon(unmade, tools)
    finally:
        if own_dir:
            shutil.rmtree(launch_dir, ignore_errors=True)
    log.info(
        "extensions.built",
        built=prepared.built,
        failed=prepared.failed,
        wall_s=round(prepared.build_s, 2),
        units_s=prepared.units,
        steps_s=build_steps(result, prepared.build_s),
    )
    return prepared, result if isinstance(result, dict) else None


def build_steps(result: Any, launch_s: float) -> dict[str, Any]:
    """Where a build launch's time went, for the log: the launch as the host saw it (the sandbox's
    start and end included), torch's import in it, and each extension's plan, compiles and link
    (harness/build.py). Written in the sandbox, so only plausible numbers are kept."""
    steps: dict[str, Any] = {"launch": round(launch_s, 3)}
    if not isinstance(result, dict):
        return steps
    if (imported := seconds(result.get("import_s"))) is not None:
        steps["import"] = imported
    entries = result.get("extensions")
    for entry in entries[:16] if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        parts = entry.get("steps_s")
        parts = parts if isinstance(parts, dict) else {}
        kept = {k: v for k in ("plan", "compile") if (v := seconds(parts.get(k))) is not None}
        if (elapsed := seconds(entry.get("elapsed_s"))) is not None:
            kept["elapsed"] = elapsed
        steps[str(entry.get("name", ""))[:80]] = kept
    return steps


def build_entries(todo: list[requests.Request], chain: dict[str, str]) -> list[str]:
    """What a build launch of these requests may see of the cache (paths in it): its units' objects,
    its flag sets' precompiled headers and its CUDA units' parts, where the cache has them."""
    entries: list[str] = []
    for request in todo:
        entries += [f"{objects.OBJECTS}/{key}.o" for key in requests.unit_keys(request, chain).values()]
        entries += header_entries(request, chain) + part_entries(request, chain)
    return entries


def reported_parts(
    result: Any, todo: dict[str, requests.Request], unmade_only: bool = False
) -> dict[str, requests.Request]:
    """The headers' parts (harness/prefixes.py) a build launch's CUDA units reported, by key (64 hex),
    each with the request of the extension whose unit it is; `unmade_only`: those the unit found no
    precompiled form of. Untrusted: a key only says which part to make or to show a later build."""
    entries = result.get("extensions") if isinstance(result, dict) else None
    wanted: dict[str, requests.Request] = {}
    for entry in entries[:16] if isinstance(entries, list) else []:
        request = todo.get(str(entry.get("key"))) if isinstance(entry, dict) else None
        parts = entry.get("parts") if request is not None else None
        if request is None or not isinstance(parts, list):
            continue
        for part in parts[:4]:
            if not isinstance(part, dict) or not isinstance(part.get("key"), str):
                continue
            if re.fullmatch(r"[0-9a-f]{64}", part["key"]) and (
                part.get("precompiled") is False or not unmade_only
            ):
                wanted.setdefault(part["key"], request)
    return wanted


def unmade_parts(result: Any, todo: dict[str, requests.Request]) -> dict[str, requests.Request]:
    """The headers' parts a build launch's CUDA units found no precompiled form of (reported_parts)."""
    return reported_parts(result, todo, unmade_only=True)


_EXTENSION_H = re.compile(r'^\s*#\s*include\s*[<"]torch/extension\.h[>"]', re.MULTILINE)
_BINDINGS = re.compile(r"\bPYBIND11_MODULE\s*\(")
_TORCH_HEADER = re.compile(r'^\s*#\s*include\s*[<"](torch|ATen|c10)/', re.MULTILINE)


def rebuild_advice(request: requests.Request) -> str | None:
    """A note for a request whose CUDA unit parses torch's headers, which every edit of its kernels then
    compiles again (read as text): how the same kernel rebuilt on 2 H200s (docs/gpu-results.md,
    "Builds") in each of three structures. None for a CUDA unit without torch headers."""
    cuda = "\n".join(request.cuda_sources)
    if not cuda:
        return None
    carries = (("includes torch/extension.h", _EXTENSION_H), ("defines PYBIND11_MODULE", _BINDINGS))
    carried = [what for what, pattern in carries if pattern.search(cuda)]
    if carried:
        subject = f"{request.name}'s CUDA source {' and '.join(carried)}"
    elif not request.no_implicit_headers:
        subject = f"{request.name}'s CUDA unit includes torch's headers (load_inline adds torch/types.h)"
    elif _TORCH_HEADER.search(cuda):
        subject = f"{request.name}'s CUDA source includes torch's headers"
    else:
        return None
    return (
        f"{subject}, which its compilers parse again on every edit of a kernel. After an edit, one "
        "kernel rebuilt on 2 H200s in 29.8 s with torch/extension.h and PYBIND11_MODULE in the CUDA "
        "source, 13.8 s with the bindings generated from functions= into cpp_sources (compiled once, "
        "then cached), and 2.2 s with a CUDA source that includes no torch header: "
        "load_inline(..., no_implicit_headers=True), the kernels and a launcher taking raw pointers in "
        "cuda_sources, and torch/extension.h, the tensors and the function it binds in cpp_sources"
    )


def _install_results(
    todo: list[tuple[str, requests.Request]],
    result: Any,
    timed_out: bool,
    files: LaunchFiles,
    prepared: Prepared,
) -> None:
    """Copy what the build launch built into the cache; keep its failures (not what it left alone)."""
    entries = result.get("extensions") if isinstance(result, dict) else None
    by_key = {}
    if isinstance(entries, list):
        by_key = {e.get("key"): e for e in entries if isinstance(e, dict)}
    for key, request in todo:
        entry = by_key.get(key)
        if entry is None:
            why = "timed out" if timed_out else "left no result"
            prepared.skipped.append(f"extension {request.name}: the build launch {why}; the launch builds it")
            continue
        if entry.get("ok") is True and _install(files, key, request):
            prepared.built.append(request.name)
            prepared.units[request.name] = unit_seconds(files.root / "extensions" / key)
        elif entry.get("ok") is False and str(entry.get("log", "")).startswith(requests.UNPLANNED):
            why = str(entry.get("log", ""))[len(requests.UNPLANNED) :][:300]
            prepared.skipped.append(f"extension {request.name} is built inside the launch: {why}")
        elif entry.get("ok") is False:
            log_text = str(entry.get("log", ""))[-requests.FAILURE_LOG_CHARS :]
            _record_failure(key, log_text)
            prepared.failed.append(request.name)
            prepared.logs[request.name] = log_text


def _install(files: LaunchFiles, key: str, request: requests.Request) -> bool:
    """Copy a build launch's extension `key` (the host's key of `request`) into the cache: only its
    library and its marks, plain files read through sandbox/untrusted.py, read-only, atomically (a
    rename); whether the cache has it now."""
    target = config.extensions_dir() / key
    if target.exists():
        return True
    staging = config.extensions_dir() / f".{key}.{os.getpid()}.{time.monotonic_ns()}"
    wanted = {
        f"{request.name}.so": MAX_LIBRARY_BYTES,
        requests.OK_MARK: MARK_BYTES,
        requests.UNITS_MARK: MARK_BYTES,
    }
    try:
        staging.mkdir()
        for name, cap in wanted.items():
            if (
                not files.copy(f"extensions/{key}/{name}", staging / name, cap)
                and name != requests.UNITS_MARK
            ):
                shutil.rmtree(staging, ignore_errors=True)
                return False
        for path in staging.iterdir():
            os.chmod(path, 0o444)
        os.replace(staging, target)
        return True
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return target.exists()


def _install_objects(files: LaunchFiles, keys: list[str]) -> int:
    """Copy into the node's object cache (harness/objects.py) the objects of `keys`, the units the host
    asked this build launch for (harness/extensions.py `unit_keys`), where the launch left them as plain
    files of at most MAX_OBJECT_BYTES; the number installed. No other file it left is read: a planted
    object under another unit's key never enters the cache."""
    target = config.extensions_dir() / objects.OBJECTS
    installed = 0
    for key in list(dict.fromkeys(keys))[:MAX_OBJECTS]:
        name = f"{key}.o"
        if not objects.KEY_RE.fullmatch(name) or (target / name).exists():
            continue
        target.mkdir(exist_ok=True)
        staging = target / f".{name}.{os.getpid()}.{time.monotonic_ns()}"
        with contextlib.suppress(OSError):
            if files.copy(f"{objects.OBJECTS}/{name}", staging, MAX_OBJECT_BYTES):
                os.chmod(staging, 0o444)
                os.replace(staging, target / name)
                installed += 1
        staging.unlink(missing_ok=True)
    return installed


def _record_failure(key: str, log_text: str) -> None:
    target = config.extensions_dir() / key
    with contextlib.suppress(OSError):
        target.mkdir(exist_ok=True)
        requests.write_mark(target, requests.FAILED_MARK, {"log": log_text})


def may_build(text: str) -> bool:
    """Whether a solution's text could build an extension (the import of one is the tell)."""
    return "load_inline" in text or "cuda_helpers" in text


def built_already(text: str) -> bool:
    """Whether every extension the text builds is in the cache already (built, or failed and kept),
    as its text says (module-level literals: compile/literal_calls.py) or its kept discovery does;
    False when neither says, without a launch."""
    if not may_build(text):
        return False
    calls = literal_calls(text)
    if calls is None:
        found = _kept_discovery(text)[1]
        calls = found.get("calls") if isinstance(found, dict) else None
    if not calls:
        return False
    wanted, why = parse_requests(calls)
    chain = toolchain()
    return not why and all(_entry_state(r.key(chain)) in ("ok", "failed") for r in wanted)


def prepare(text: str, tools: ToolRunner, timeout_s: float) -> Prepared:
    """Discover and build a solution's extensions before its launches run; nothing when it has none."""
    if not may_build(text):
        return Prepared()
    literal = literal_calls(text)  # the common case needs no discovery launch: an edit costs a build only
    found = {"calls": literal} if literal is not None else discover(text, tools, timeout_s)
    if isinstance(found, str):
        return Prepared(skipped=[f"extensions not prebuilt: {found}"])
    wanted, why = parse_requests(found.get("calls"))
    prepared, _ = build_requests(wanted, tools, timeout_s)
    prepared.skipped = why + prepared.skipped
    prepared.requests = wanted
    return prepared
