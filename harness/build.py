"""A build launch: compiler runs and extension builds, inside the sandbox, with no candidate code.

The host plans every compiler command (pkb_mcp/compile/: flags from an allow-list, sources written
as text into the launch directory) and every extension build (harness/extensions.py requests whose flags
passed the same allow-list). This program only runs them, side by side, and writes `build.json`, a
BuildRecord (harness/contracts.py):

  {"commands": [{"returncode", "output", "elapsed_s", "header"}],
   "extensions": [{"key", "name", "ok", "log", "elapsed_s", "steps_s", "parts"}],
   "headers": [{"key", "ok", "cached", "log", "elapsed_s"}],
   "parts": [{"key", "ok", "cached", "log", "elapsed_s"}],
   "import_s"}

`steps_s` splits an extension's time into its plan and its compiles and link; `parts` names its CUDA
units' headers' parts (harness/prefixes.py) and whether the cache had them precompiled; `import_s` is
torch's import, before any of them.

`returncode` is None for a command killed at the deadline. Paths of the launch directory in outputs are
written as `<build>`, so the host can map them back whatever the sandbox mounted the launch at. Built
extensions are left in `extensions/<key>/`, precompiled headers (harness/headers.py, asked for
with no other work in the launch) in `headers/<key>/`, CUDA units' precompiled headers' parts
(harness/prefixes.py, asked for likewise) in `prefixes/<key>/`, for the host to move into the node's
cache; nothing here loads them (their initializers are candidate code). Stdlib + torch only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import extensions, headers, nvcc, objects, prefixes
from harness.contracts import (
    BuildCommand,
    BuildRecord,
    CommandResult,
    ExtensionBuild,
    HeaderBuild,
    ToolConfig,
    read_tool_config,
)

MAX_OUTPUT_BYTES = 1 << 20
PARALLEL = 4


def run_command(argv: list[str], cwd: Path, env: dict[str, str], deadline: float) -> CommandResult:
    """One compiler run in its own session, output to a file; the whole session killed at the deadline."""
    start = time.monotonic()
    out_path = cwd / f".out-{time.monotonic_ns()}-{threading.get_ident()}.txt"
    with open(out_path, "wb") as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return {"returncode": 127, "output": f"could not start {argv[0]}: {exc}", "elapsed_s": 0.0}
        try:
            returncode: int | None = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            returncode = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(out_path, "rb") as out:
        output = out.read(MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")
    out_path.unlink(missing_ok=True)
    return {"returncode": returncode, "output": output, "elapsed_s": round(time.monotonic() - start, 3)}


def _run_planned(
    command: BuildCommand, launch_dir: Path, env: dict[str, str], deadline: float, header_root: Path | None
) -> CommandResult:
    """One of the host's compiler runs; a C++ syntax check given a header key finds that precompiled
    header in the cache's view where it is there (harness/headers.py `argv_with`), and its result says
    whether GCC took it (`header`: -Winvalid-pch names a refusal)."""
    argv = list(command["argv"])
    offered = headers.argv_with(argv, header_root, command.get("header"))
    if offered is not None:
        argv = [offered[0], "-Winvalid-pch", *offered[1:]]
    result = run_command(argv, Path(command.get("cwd") or launch_dir), env, deadline)
    if offered is not None:
        result["header"] = prefixes.INVALID not in result["output"]
    return result


def compiler_env(launch_dir: Path) -> dict[str, str]:
    """Compilers need PATH (nvcc finds gcc there); nothing else of the sandbox's environment."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(launch_dir),
        "TMPDIR": os.environ.get("TMPDIR", str(launch_dir)),
        "LC_ALL": "C",
    }


def _build_extension(data: dict[str, Any], launch_dir: Path) -> ExtensionBuild:
    start = time.monotonic()
    entry: ExtensionBuild = {
        "key": None,
        "name": str(data.get("name", "")),
        "ok": False,
        "log": "",
        "elapsed_s": 0.0,
        "steps_s": {},
        "parts": [],
    }
    try:
        request = extensions.Request.from_json(data)
        key = request.key(extensions.toolchain())
        entry["key"] = key
        if (flag := extensions.unsafe_flag(request)) is not None:
            raise extensions.Unplanned(f"{extensions.UNPLANNED}its flag {flag[:80]!r} is not plain text")
        directory = launch_dir / "extensions" / key
        # quiet: a failed build raises with the compiler's output, which is all the host needs
        with contextlib.redirect_stdout(io.StringIO()):
            store = launch_dir / objects.OBJECTS
            extensions.build(request, directory, verbose=False, store=store, steps_s=entry["steps_s"])
        extensions.write_mark(directory, extensions.OK_MARK, {"name": request.name})
        entry["ok"] = True
        units = extensions.read_mark(directory, extensions.UNITS_MARK) or {}
        entry["parts"] = list(units.get("parts", []))
    except Exception as exc:
        entry["log"] = str(exc)[-extensions.FAILURE_LOG_CHARS :]
    entry["elapsed_s"] = round(time.monotonic() - start, 3)
    return entry


def make_header(data: Any, launch_dir: Path, cache: Path | None) -> HeaderBuild:
    """Make the header for a request's flags (`data`: `extra_cflags`, `with_cuda`; allow-listed by the
    host) into `launch_dir`/headers, unless `cache` has it. What happened: key, ok, cached, log."""
    request = extensions.Request(
        name="pkb_headers",
        cpp_sources=("",),
        extra_cflags=tuple(str(f) for f in data.get("extra_cflags", ())),
        with_cuda=bool(data.get("with_cuda", True)),
    )
    # this set's own folder: sets are made side by side, and each removes only its own
    scratch = launch_dir / "headers-scratch" / hashlib.sha256(repr(request).encode()).hexdigest()[:16]
    with _header_entry(scratch) as entry:
        chain = extensions.toolchain()
        header_key = extensions.header_key(request, chain)
        entry["key"] = header_key
        if (flag := extensions.unsafe_flag(request)) is not None:
            raise RuntimeError(f"the flag {flag[:80]!r} is not plain text: no header is made for it")
        steps = extensions.build_steps(request, extensions.source_files(request, scratch), scratch)
        step = next((s for s in steps or () if s.rule == "compile"), None)
        unit_flags = headers.flags(step) if step is not None else None
        if unit_flags is None:
            raise RuntimeError("torch's build file has no C++ step this module knows")
        if cache is not None and headers.path(cache, header_key).is_file():
            entry["ok"] = entry["cached"] = True
            return entry
        target = headers.path(launch_dir / headers.HEADERS, header_key)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = torch_header()
        argv = [*unit_flags, "-x", "c++-header", str(source), "-o", str(target)]
        env = compiler_env(launch_dir)
        proc = subprocess.run(
            argv, cwd=scratch, env=env, capture_output=True, check=False, stdin=subprocess.DEVNULL
        )
        entry["ok"] = proc.returncode == 0 and target.is_file()
        output = (proc.stdout + proc.stderr).decode("utf-8", errors="replace")
        entry["log"] = output[-extensions.FAILURE_LOG_CHARS :]
        if not entry["ok"]:
            shutil.rmtree(target.parent.parent, ignore_errors=True)
    return entry


def make_part(data: Any, launch_dir: Path, cache: Path | None) -> HeaderBuild:
    """Precompile the headers' part of the CUDA unit of an extension request (`data`, allow-listed by the
    host) into `launch_dir`/prefixes. What happened: key, ok, cached (`cache`, the cache's parts, had it
    already: another build asked first), log. The unit's host chain runs again here, to learn its part:
    only the compilers; nothing is loaded."""
    scratch = launch_dir / "parts-scratch" / hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]
    with _header_entry(scratch) as entry:
        request = extensions.Request.from_json(data)
        if (flag := extensions.unsafe_flag(request)) is not None:
            raise RuntimeError(f"the flag {flag[:80]!r} is not plain text: no part is made for it")
        steps = extensions.build_steps(request, extensions.source_files(request, scratch), scratch)
        step = next((s for s in steps or () if s.rule == "cuda_compile"), None)
        if step is None:
            raise RuntimeError("the request's build file has no CUDA unit this module knows")
        made = launch_dir / prefixes.PREFIXES
        unit, chain = Path(step.inputs[0]), extensions.toolchain()
        key = nvcc.make_part(step.command, scratch, unit, step.output, chain, made)
        entry["key"] = key
        entry["cached"] = cache is not None and (cache / key / f"{prefixes.HEADER}.gch").is_file()
        entry["ok"] = True
    return entry


@contextlib.contextmanager
def _header_entry(scratch: Path) -> Iterator[HeaderBuild]:
    """A header's entry: timed, an exception kept as its log, its own scratch folder removed after (and
    the folder of those, by the last to end: headers are made side by side)."""
    start = time.monotonic()
    entry: HeaderBuild = {"key": None, "ok": False, "cached": False, "log": "", "elapsed_s": 0.0}
    try:
        yield entry
    except Exception as exc:
        entry["log"] = str(exc)[-extensions.FAILURE_LOG_CHARS :]
    finally:
        entry["elapsed_s"] = round(time.monotonic() - start, 3)
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(OSError):
            scratch.parent.rmdir()


def torch_header() -> Path:
    """torch's own `torch/extension.h`, at the path every sandbox sees too (the host's stub names it)."""
    from torch.utils import cpp_extension

    for include in cpp_extension.include_paths():
        candidate = Path(include) / headers.HEADER
        if candidate.is_file():
            return candidate
    raise RuntimeError(f"{headers.HEADER} is not in torch's include paths")


def main(cfg: ToolConfig) -> BuildRecord:
    launch_dir = Path(cfg["launch_dir"])
    deadline = time.monotonic() + float(cfg["timeout_s"])
    env = compiler_env(launch_dir)
    commands = cfg.get("commands", [])
    requests = cfg.get("extensions", [])
    cache = os.environ.get(extensions.CACHE_ENV)
    header_cache = Path(cache) / objects.OBJECTS / headers.HEADERS if cache else None
    part_cache = Path(cache) / objects.OBJECTS / prefixes.PREFIXES if cache else None
    start = time.monotonic()
    if requests or cfg.get("headers") or cfg.get("parts"):
        import torch.utils.cpp_extension  # noqa: F401 - every build and header needs it: timed alone
    import_s = round(time.monotonic() - start, 3)
    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        ran = [pool.submit(_run_planned, c, launch_dir, env, deadline, header_cache) for c in commands]
        built = [pool.submit(_build_extension, r, launch_dir) for r in requests]
        made = [pool.submit(make_header, h, launch_dir, header_cache) for h in cfg.get("headers", [])]
        parts = [pool.submit(make_part, p, launch_dir, part_cache) for p in cfg.get("parts", [])]
        results = [f.result() for f in ran]
        built_results = [f.result() for f in built]
        made_results = [f.result() for f in made]
        part_results = [f.result() for f in parts]
    prefix = str(launch_dir)
    for r in results:
        r["output"] = r["output"].replace(prefix, "<build>")
    for b in [*built_results, *made_results, *part_results]:
        b["log"] = b["log"].replace(prefix, "<build>")
    return {
        "commands": results,
        "extensions": built_results,
        "headers": made_results,
        "parts": part_results,
        "import_s": import_s,
    }


if __name__ == "__main__":
    json.dump(main(read_tool_config(json.loads(sys.stdin.read()))), sys.stdout)
