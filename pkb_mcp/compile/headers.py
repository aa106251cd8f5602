"""Precompiled headers in the node's cache: torch's, for the C++ unit of extension builds
(harness/headers.py), and each CUDA unit's headers' part, for its host compile (harness/prefixes.py).

The first time this process builds an extension with a given set of C++ flags (a request's allow-listed
`extra_cflags`, with CUDA or without), or checks the syntax of its C++ source (`pkb compile`), it asks
for that set's header in a build launch of its own, in the background, unless the node's cache has it
(a header is made once per flag set and toolchain, and kept): a launch that holds no candidate source,
so the header is a function of torch's headers, those flags and the toolchain alone, as its key says.
Builds and syntax checks after it find the header in the cache (read-only) and compile `main.cpp` in a
fraction of the time (`check_key`: a check's flags are its build's C++ unit's); one before it compiles
as it always did. `pkb serve` asks for the default flags' headers when it starts (`default_sets`); a
command line waits for the header it asked for before it exits (`finish`), so that its next run has it.
On every node, CPU or GPU; not where launch directories lie on another file system than the cache,
whose launches' views could not show a header (pkb_mcp/extension_view.py VIEW_COPY_CAP).

A CUDA unit's part is known only once its build has run `cudafe++`: the build reports its key, and
where the cache had no such part, the host asks for it in a build launch of its own, in the background,
given the extension's request (`prepare_parts_soon`): the unit's host chain again, then the part
precompiled. The builds after it whose unit opens with the same headers (a kernel edited, another file
with the same includes and flags) compile only their own lines.

What the launches leave is untrusted (sandbox/untrusted.py reads it: no link followed, sizes bounded):
only `headers/<key>/torch/extension.h.gch` for a key the host computed for a flag set it asked for
(harness/headers.py `key`), and `prefixes/<key>/prefix.h` and `prefix.h.gch` for a key the launch was
asked to make, plain files of at most MAX_HEADER_BYTES, are copied into the cache (read-only, 0444);
the host writes torch's stub header beside its `.gch` (harness/headers.py `stub_text`). Anything else
a launch left is ignored. A part's key is over the text cudafe++ writes, which only a build learns:
`remember_part` keeps which part a build of a request reported (by the request's `part_index`), and
`part_entries` lets the next build of the same index see that part alone.
PKB_PRECOMPILED_HEADERS=0 (`enabled`) turns both off (the test suite: each test has a cache of its own).
Imports pkb_mcp.config, log and harness.build, extensions, headers, objects, prefixes.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness import extensions as requests
from harness import headers, objects, prefixes
from harness.build import torch_header
from pkb_mcp import config
from pkb_mcp.log import get
from sandbox.toolchain import jit_env
from sandbox.untrusted import LaunchFiles

log = get(__name__)

MAX_HEADER_BYTES = 2 << 30  # torch 2.11's, with its flags: about 0.8 GB
TIMEOUT_S = 600.0
_KEY = re.compile(r"[0-9a-f]{64}")
THREAD = "headers"  # the name of a header launch's thread
_asked: set[tuple[tuple[str, ...], bool]] = set()
_asked_parts: set[str] = set()
_part_of: dict[str, str] = {}  # a request's part_index -> the part key its last build reported
_lock = threading.Lock()


def _toolchain() -> dict[str, str]:
    return requests.toolchain({**os.environ, **jit_env()})  # as pkb_mcp/compile/extensions.py toolchain


def header_entries(request: requests.Request, chain: dict[str, str]) -> list[str]:
    """The cache's files (paths in it) of the precompiled header a build of `request` may use."""
    return header_files(requests.header_key(request, chain))


def header_files(key: str) -> list[str]:
    """The cache's files (paths in it) of the precompiled header `key`: its stub and the header."""
    rel = f"{objects.OBJECTS}/{headers.HEADERS}/{key}/{headers.HEADER}"
    return [rel, f"{rel}.gch"]


def remember_part(request: requests.Request, key: str, chain: dict[str, str]) -> None:
    """Keep the part key a build of `request` reported for its CUDA unit (untrusted: it only decides
    which existing part the next build of the same part_index may see)."""
    index = requests.part_index(request, chain)
    if index is not None and _KEY.fullmatch(key):
        with _lock:
            _part_of[index] = key


def part_entries(request: requests.Request, chain: dict[str, str]) -> list[str]:
    """The cache's files of the headers' part a build of `request` may use (part_index's), if known."""
    index = requests.part_index(request, chain)
    with _lock:
        key = _part_of.get(index) if index is not None else None
    if key is None:
        return []
    rel = f"{objects.OBJECTS}/{prefixes.PREFIXES}/{key}/{prefixes.HEADER}"
    return [rel, f"{rel}.gch"]


def flag_set(request: requests.Request) -> dict[str, Any]:
    """What of a request decides its C++ unit's flags, as a build launch's `headers` entry takes it."""
    with_cuda = request.with_cuda if request.with_cuda is not None else bool(request.cuda_sources)
    return {"extra_cflags": list(request.extra_cflags), "with_cuda": with_cuda}


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None


def default_sets() -> list[dict[str, Any]]:
    """The flag sets of a request that sets no flags of its own, that this node's torch builds: C++
    alone, and with CUDA sources where torch has CUDA (a CPU build of torch builds no CUDA unit)."""
    sets = [{"extra_cflags": [], "with_cuda": False}]
    return [*sets, {"extra_cflags": [], "with_cuda": True}] if _torch_has_cuda() else sets


def check_key(request: requests.Request, chain: dict[str, str]) -> str:
    """The key of the header a syntax check of the request's C++ source may use (compile/solution.py):
    its build's flag set's, without CUDA where torch has none (GCC does not weigh the include
    folders that CUDA adds, and a CPU node makes no header with CUDA)."""
    chosen = flag_set(request)
    return headers.key(chosen["extra_cflags"], chosen["with_cuda"] and _torch_has_cuda(), chain)


def check_set(request: requests.Request) -> dict[str, Any]:
    """The flag set of `check_key`, as `prepare_soon` takes it."""
    chosen = flag_set(request)
    return {**chosen, "with_cuda": chosen["with_cuda"] and _torch_has_cuda()}


def enabled() -> bool:
    """PKB_PRECOMPILED_HEADERS: "auto" (the default) and "1" on, "0" off. Builds of the same flag set
    as a header are faster on CPU nodes as on GPU nodes: a C++ unit that includes torch/extension.h
    compiled in 11 s with it, 35 s without, on 2 cores (docs/sandbox.md, "Build times on a CPU
    node")."""
    return config.precompiled_headers() != "0"


def in_cache(flag_set: dict[str, Any]) -> bool:
    """Whether the node's cache has this flag set's header (a plain file: the host's)."""
    found = headers.path(
        cache_root(), headers.key(flag_set["extra_cflags"], flag_set["with_cuda"], _toolchain())
    )
    return found.is_file() and not found.is_symlink()


def _seen_by_launches() -> bool:
    """Whether a launch's view can show a header: the view links the cache's entries, and copies only
    smaller ones where the launch directories lie on another file system (pkb_mcp/launches.py)."""
    try:
        return os.stat(config.launches_dir()).st_dev == os.stat(config.extensions_dir()).st_dev
    except OSError:
        return False


def _ident(flag_set: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    return tuple(flag_set["extra_cflags"]), bool(flag_set["with_cuda"])


def cache_root() -> Path:
    return config.extensions_dir() / objects.OBJECTS / headers.HEADERS


def parts_root() -> Path:
    return config.extensions_dir() / objects.OBJECTS / prefixes.PREFIXES


def _launch(
    kind: str,
    params: list[dict[str, Any]],
    installed_by: Callable[[LaunchFiles], int],
    tools: Any,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """One build launch making headers (`kind`: "headers" or "parts"); `installed_by` installs what it
    left (given its files, read untrusted); the launch's entries."""
    launch_dir = tools.new_dir()
    try:
        start = time.monotonic()
        tools.run("build", launch_dir, {kind: params}, timeout_s)
        made = _entries(launch_dir / "build.json", kind)
        installed = installed_by(LaunchFiles(launch_dir, budget=64 * MAX_HEADER_BYTES))
        log.info(f"{kind}.made", wall_s=round(time.monotonic() - start, 2), installed=installed, made=made)
        return made
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def prepare(sets: list[dict[str, Any]], tools: Any, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Make these flag sets' headers in one build launch and install them; the launch's entries."""
    with _lock:
        _asked.update(_ident(s) for s in sets)
    chain = _toolchain()
    keys = [headers.key(s["extra_cflags"], s["with_cuda"], chain) for s in sets]
    return _launch("headers", sets, lambda made: install(made, keys), tools, timeout_s)


def prepare_parts(
    wanted: dict[str, requests.Request], tools: Any, timeout_s: float = TIMEOUT_S
) -> list[dict[str, Any]]:
    """Make the headers' parts of these keys (each with the request whose CUDA unit has it) in one
    build launch and install them; the launch's entries."""
    with _lock:
        _asked_parts.update(wanted)
    params = [r.to_json() for r in wanted.values()]
    return _launch("parts", params, lambda made: install_parts(made, list(wanted)), tools, timeout_s)


def prepare_soon(sets: Iterable[dict[str, Any]], tools: Any) -> threading.Thread | None:
    """`prepare` in the background for the sets this process has not asked for yet (isolated sandboxes
    only: the cache is filled by build launches); the thread, or None when there is nothing to do."""
    if not tools.isolated or not enabled() or not _seen_by_launches():
        return None
    wanted = [s for s in {_ident(s): s for s in sets}.values() if not in_cache(s)]
    with _lock:
        fresh = [s for s in wanted if _ident(s) not in _asked]
        _asked.update(_ident(s) for s in fresh)

    def forget() -> None:
        with _lock:
            _asked.difference_update(_ident(s) for s in fresh)

    return _in_background(fresh, lambda: prepare(fresh, tools), forget)


def prepare_parts_soon(wanted: dict[str, requests.Request], tools: Any) -> threading.Thread | None:
    """`prepare_parts` in the background for the keys this process has not asked for and the cache does
    not hold; the thread, or None when there is nothing to do."""
    if not tools.isolated or not enabled():
        return None
    with _lock:
        fresh = {
            k: r
            for k, r in wanted.items()
            if _KEY.fullmatch(k) and k not in _asked_parts and not _part_files(parts_root() / k)
        }
        _asked_parts.update(fresh)

    def forget() -> None:
        with _lock:
            _asked_parts.difference_update(fresh)

    return _in_background(list(fresh), lambda: prepare_parts(fresh, tools), forget)


def _in_background(
    fresh: list[Any], make: Callable[[], list[dict[str, Any]]], forget: Callable[[], None]
) -> threading.Thread | None:
    if not fresh:
        return None

    def run() -> None:
        try:
            made = make()
        except Exception as exc:  # a header is an acceleration: its failure is logged, never raised
            log.warning("headers.failed", error=repr(exc)[:500])
            made = []
        if not made:  # no launch result (cancelled, failed to start): asked again by the next build;
            forget()  # what the compiler refused is not, since it would be refused again

    thread = threading.Thread(target=run, name=THREAD, daemon=True)
    thread.start()
    return thread


def pending() -> list[threading.Thread]:
    """The header launches this process has under way."""
    return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


def finish(say: Callable[[str], None], timeout_s: float = TIMEOUT_S) -> None:
    """Wait for the header launches under way (a command line's end: its process would otherwise end
    them, and every later process would make the header again); `say` is told why it waits."""
    under_way = pending()
    if not under_way:
        return
    say("finishing torch's precompiled header for later builds (made once per toolchain)")
    deadline = time.monotonic() + timeout_s
    for thread in under_way:
        thread.join(max(deadline - time.monotonic(), 0.0))


def _entries(path: Path, kind: str) -> list[dict[str, Any]]:
    from pkb_mcp.launches import read_result

    found = read_result(path, 1 << 20)
    entries = found.get(kind) if isinstance(found, dict) else None
    if not isinstance(entries, list):
        return []
    keep = ("key", "ok", "cached", "elapsed_s")
    made = [{k: e.get(k) for k in keep} for e in entries[:16] if isinstance(e, dict)]
    for m, e in zip(made, entries, strict=False):
        if m.get("ok") is not True:  # why, for the log: the compiler's last words
            m["log"] = str(e.get("log", ""))[-300:]
    return made


def _place(made: LaunchFiles, files: list[tuple[str, str]], target: Path, extra: dict[str, str]) -> bool:
    """Copy a launch's files (`files`: its path, the name in the entry) into a new cache entry
    `target`, with `extra` files of the host's text, read-only, atomically (a rename); whether placed.
    A file that is not a plain file of at most MAX_HEADER_BYTES places nothing."""
    if target.exists():
        return False
    staging = target.parent / f".{target.name}.{os.getpid()}.{time.monotonic_ns()}"
    try:
        for rel, name in files:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            if not made.copy(rel, staging / name, MAX_HEADER_BYTES):
                shutil.rmtree(staging, ignore_errors=True)
                return False
        for name, text in extra.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)
        for path in staging.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o444)
        os.replace(staging, target)
        return True
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False


def install(made: LaunchFiles, keys: Iterable[str]) -> int:
    """Copy the headers a build launch was asked to make (`keys`: the host's, of the flag sets it asked
    for) from its `headers/` folder into the node's cache; how many. Nothing else it left is read."""
    target_root = cache_root()
    target_root.mkdir(parents=True, exist_ok=True)
    installed = 0
    for key in dict.fromkeys(keys):
        if not _KEY.fullmatch(key):
            continue
        rel = f"{headers.HEADERS}/{key}/{headers.HEADER}.gch"
        stub = {headers.HEADER: headers.stub_text(torch_header())}
        installed += _place(made, [(rel, f"{headers.HEADER}.gch")], target_root / key, stub)
    return installed


def _part_files(folder: Path) -> tuple[Path, Path] | None:
    """A part's header and its precompiled form in `folder` (the cache's), where both are plain files;
    else None."""
    header = folder / prefixes.HEADER
    compiled = folder / f"{prefixes.HEADER}.gch"
    for path in (folder, header, compiled):
        if path.is_symlink() or not path.exists():
            return None
    if not (header.is_file() and compiled.is_file()):
        return None
    return header, compiled


def install_parts(made: LaunchFiles, keys: Iterable[str]) -> int:
    """Copy the headers' parts a build launch was asked to make (`keys`) from its `prefixes/` folder into
    the node's cache; how many. Nothing else it left is read."""
    target_root = parts_root()
    target_root.mkdir(parents=True, exist_ok=True)
    installed = 0
    for key in dict.fromkeys(keys):
        if not _KEY.fullmatch(key):
            continue
        names = (prefixes.HEADER, f"{prefixes.HEADER}.gch")
        files = [(f"{prefixes.PREFIXES}/{key}/{name}", name) for name in names]
        installed += _place(made, files, target_root / key, {})
    return installed
