"""A standalone `.cu`/`.cuh` file: copied with the headers it includes from its own folder into a build
launch, compiled with nvcc -cubin for one architecture, cached as a whole.

Offers `compile_cuda_file`. Imports pkb_mcp.compile.cache, extensions, results, toolchain and units."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pkb_mcp.compile.cache import Cache, cached_result, local_dependencies, read_source
from pkb_mcp.compile.extensions import ToolRunner
from pkb_mcp.compile.results import CompileResult
from pkb_mcp.compile.toolchain import (
    CU_STD,
    find_nvcc,
    nvcc_argv,
    stand_in_dir,
    stand_in_notes,
    toolchain_fingerprint,
)
from pkb_mcp.compile.units import Command, UnitPlan, run_plans, safe_identifier, unit_result


def compile_cuda_file(
    text: str,
    *,
    path: Path,
    display: str,
    arch: str,
    cache: Cache,
    tools: ToolRunner,
    deadline: float,
    timeout_s: float,
) -> CompileResult:
    """Build the text of the `.cu`/`.cuh` file at `path` with nvcc, or take the result from `cache`."""
    nvcc = find_nvcc()
    start = time.monotonic()
    deps = local_dependencies([(text, path.parent)], [], root=path.parent)
    material: dict[str, object] = {
        "level": "cuda-file",
        "arch": arch,
        "display": display,
        "source": text,
        "deps": deps,
        "toolchain": toolchain_fingerprint(nvcc),
    }
    key = cache.key(material)
    cached = cached_result(cache, key)
    if cached is not None:
        return cached
    work = tools.new_dir()
    try:
        # the sandbox sees copies: the file, and the headers it includes from its own folder
        src = work / "src"
        source = src / path.name
        src.mkdir()
        source.write_text(text, encoding="utf-8")
        for dep in deps:
            relative = Path(dep).relative_to(path.parent)
            (src / relative).parent.mkdir(parents=True, exist_ok=True)
            (src / relative).write_text(read_source(dep), encoding="utf-8")
        stand_ins = stand_in_dir(work, nvcc)
        argv = nvcc_argv(
            nvcc,
            source=source,
            out=work / "out.cubin",
            arch=arch,
            std=CU_STD,
            extension=safe_identifier(path.stem),
            stand_ins=stand_ins,
            include_dirs=[],
            extra=[],
        )
        paths = {str(source): display, **{str(src / Path(d).relative_to(path.parent)): d for d in deps}}
        # The whole result is cached below; a command-level entry would duplicate it (no key material).
        command = Command("nvcc", argv, key_material={}, paths=paths)
        plan = UnitPlan(name=Path(display).name, commands=[command], work=work, toolchain={}, inputs=deps)
        ran, _ = run_plans([plan], cache, tools, work, deadline)
        unit = unit_result(plan, ran[0], timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes = [
        "compiled with nvcc -cubin: host code is checked by the CUDA front end, not compiled by the host "
        "compiler; no object file is produced"
    ]
    notes += stand_in_notes(nvcc, [text, *(read_source(p) for p in deps)])
    result = CompileResult(
        ok=unit.ok,
        kind="cuda",
        source=display,
        arch=arch,
        units=[unit],
        build_time_s=round(time.monotonic() - start, 3),
        cache_hit=False,
        notes=notes,
    )
    if not any(d.tool == "pkb" and d.severity == "error" for d in unit.diagnostics):
        cache.store(key, result, deps)
    return result
