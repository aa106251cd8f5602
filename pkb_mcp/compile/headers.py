"""Precompiled headers in the node's cache: torch's, for the C++ unit of extension builds
(harness/headers.py), and each CUDA unit's headers' part, for its host compile (harness/prefixes.py).

The first time this process builds an extension with a given set of C++ flags (a request's allow-listed
`extra_cflags`, with CUDA or without), it asks for that set's header in a build launch of its own, in
the background: a launch that holds no candidate source, so the header is a function of torch's
headers, those flags and the toolchain alone, as its key says. Builds after it find the header in
the cache (read-only) and compile `main.cpp` in a fraction of the time; a build before it compiles as
it always did. `pkb serve` asks for the default flags' headers when it starts (DEFAULT_SETS).

A CUDA unit's part is known only once its build has run `cudafe++`: the build reports its key, and
where the cache had no such part, the host asks for it in a build launch of its own, in the background,
given the extension's request (`prepare_parts_soon`): the unit's host chain again, then the part
precompiled. The builds after it whose unit opens with the same headers (a kernel edited, another file
with the same includes and flags) compile only their own lines.

What the launches leave is untrusted: only `headers/<64 hex>/torch/extension.h.gch` and
`prefixes/<64 hex>/prefix.h` and `prefix.h.gch`, plain files of at most MAX_HEADER_BYTES, are copied
into the cache, and the host writes torch's stub header beside its `.gch` (harness/headers.py
`stub_text`). PKB_PRECOMPILED_HEADERS (`enabled`) turns both off, or on where torch has no CUDA (tests).
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

log = get(__name__)

# a request's flags when it sets none of its own: with CUDA sources, and C++ alone
DEFAULT_SETS = [{"extra_cflags": [], "with_cuda": True}, {"extra_cflags": [], "with_cuda": False}]
MAX_HEADER_BYTES = 2 << 30  # torch 2.11's, with its flags: about 0.8 GB
TIMEOUT_S = 600.0
_KEY = re.compile(r"[0-9a-f]{64}")
_asked: set[tuple[tuple[str, ...], bool]] = set()
_asked_parts: set[str] = set()
_lock = threading.Lock()


def flag_set(request: requests.Request) -> dict[str, Any]:
    """What of a request decides its C++ unit's flags, as a build launch's `headers` entry takes it."""
    with_cuda = request.with_cuda if request.with_cuda is not None else bool(request.cuda_sources)
    return {"extra_cflags": list(request.extra_cflags), "with_cuda": with_cuda}


def enabled() -> bool:
    """PKB_PRECOMPILED_HEADERS: "auto" (the default) where torch is built with CUDA, else 0 or 1."""
    mode = config.precompiled_headers()
    if mode == "auto":
        import torch

        return torch.version.cuda is not None
    return mode == "1"


def _ident(flag_set: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    return tuple(flag_set["extra_cflags"]), bool(flag_set["with_cuda"])


def cache_root() -> Path:
    return config.extensions_dir() / objects.OBJECTS / headers.HEADERS


def parts_root() -> Path:
    return config.extensions_dir() / objects.OBJECTS / prefixes.PREFIXES


def _launch(
    kind: str, params: list[dict[str, Any]], installed_by: Callable[[Path], int], tools: Any, timeout_s: float
) -> list[dict[str, Any]]:
    """One build launch making headers (`kind`: "headers" or "parts"); `installed_by` installs what it
    left (given its directory); the launch's entries."""
    launch_dir = tools.new_dir()
    try:
        start = time.monotonic()
        tools.run("build", launch_dir, {kind: params}, timeout_s)
        made = _entries(launch_dir / "build.json", kind)
        installed = installed_by(launch_dir)
        log.info(f"{kind}.made", wall_s=round(time.monotonic() - start, 2), installed=installed, made=made)
        return made
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def prepare(sets: list[dict[str, Any]], tools: Any, timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Make these flag sets' headers in one build launch and install them; the launch's entries."""
    with _lock:
        _asked.update(_ident(s) for s in sets)
    return _launch("headers", sets, lambda made: install(made / headers.HEADERS), tools, timeout_s)


def prepare_parts(
    wanted: dict[str, requests.Request], tools: Any, timeout_s: float = TIMEOUT_S
) -> list[dict[str, Any]]:
    """Make the headers' parts of these keys (each with the request whose CUDA unit has it) in one
    build launch and install them; the launch's entries."""
    with _lock:
        _asked_parts.update(wanted)
    params = [r.to_json() for r in wanted.values()]
    return _launch("parts", params, lambda made: install_parts(made / prefixes.PREFIXES), tools, timeout_s)


def prepare_soon(sets: Iterable[dict[str, Any]], tools: Any) -> threading.Thread | None:
    """`prepare` in the background for the sets this process has not asked for yet (isolated sandboxes
    only: the cache is filled by build launches); the thread, or None when there is nothing to do."""
    if not tools.isolated or not enabled():
        return None
    with _lock:
        fresh = [s for s in {_ident(s): s for s in sets}.values() if _ident(s) not in _asked]
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

    thread = threading.Thread(target=run, name="headers", daemon=True)
    thread.start()
    return thread


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


def install(made: Path) -> int:
    """Copy the headers a build launch made (`made`: its headers folder) into the node's cache; how many."""
    if made.is_symlink() or not made.is_dir():
        return 0
    target_root = cache_root()
    installed = 0
    for folder in sorted(made.iterdir())[:16]:
        found = headers.path(made, folder.name)
        if not _KEY.fullmatch(folder.name) or folder.is_symlink() or found.parent.is_symlink():
            continue
        if found.is_symlink() or not found.is_file() or found.stat().st_size > MAX_HEADER_BYTES:
            continue
        target = headers.path(target_root, folder.name)
        if target.is_file():
            continue
        staging = target_root / f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            placed = staging / f"{headers.HEADER}.gch"
            placed.parent.mkdir(parents=True)
            shutil.copyfile(found, placed, follow_symlinks=False)
            (staging / headers.HEADER).write_text(headers.stub_text(torch_header()))
            os.replace(staging, target_root / folder.name)
            installed += 1
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return installed


def _part_files(folder: Path) -> tuple[Path, Path] | None:
    """A part's header and its precompiled form in `folder`, where both are plain files of at most
    MAX_HEADER_BYTES; else None."""
    header = folder / prefixes.HEADER
    compiled = folder / f"{prefixes.HEADER}.gch"
    for path in (folder, header, compiled):
        if path.is_symlink() or not path.exists():
            return None
    if not (header.is_file() and compiled.is_file()):
        return None
    if max(header.stat().st_size, compiled.stat().st_size) > MAX_HEADER_BYTES:
        return None
    return header, compiled


def install_parts(made: Path) -> int:
    """Copy the headers' parts a build launch made (`made`: its prefixes folder) into the node's cache;
    how many."""
    if made.is_symlink() or not made.is_dir():
        return 0
    target_root = parts_root()
    installed = 0
    for folder in sorted(made.iterdir())[:16]:
        found = _part_files(folder) if _KEY.fullmatch(folder.name) else None
        if found is None or (target_root / folder.name).exists():
            continue
        staging = target_root / f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            staging.mkdir(parents=True)
            for path in found:
                shutil.copyfile(path, staging / path.name, follow_symlinks=False)
            os.replace(staging, target_root / folder.name)
            installed += 1
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return installed
