"""A standalone `.cu`/`.cuh` file: copied with the headers it includes from its own folder into a build
launch, compiled with nvcc -cubin for one architecture, cached as a whole."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pkb_mcp.compile.cache import _Cache, _cached_result, _local_dependencies, _read
from pkb_mcp.compile.results import CompileResult
from pkb_mcp.compile.toolchain import (
    _CU_STD,
    _find_nvcc,
    _missing_library_headers,
    _stand_in_dir,
    _stand_in_notes,
    _toolchain_fingerprint,
)
from pkb_mcp.compile.units import (
    Tools,
    _Command,
    _execute,
    _nvcc_argv,
    _safe_identifier,
    _unit_result,
    _UnitPlan,
)


def _compile_cuda_file(
    text: str,
    *,
    path: Path,
    display: str,
    arch: str,
    cache: _Cache,
    tools: Tools,
    deadline: float,
    timeout_s: float,
) -> CompileResult:
    nvcc = _find_nvcc()
    start = time.monotonic()
    deps = _local_dependencies([(text, path.parent)], [], root=path.parent)
    material: dict[str, object] = {
        "level": "cuda-file",
        "arch": arch,
        "display": display,
        "source": text,
        "deps": deps,
        "toolchain": _toolchain_fingerprint(nvcc),
    }
    key = cache.key(material)
    cached = _cached_result(cache, key)
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
            (src / relative).write_text(_read(dep), encoding="utf-8")
        stand_ins = _stand_in_dir(work, nvcc)
        argv = _nvcc_argv(
            nvcc,
            source=source,
            out=work / "out.cubin",
            arch=arch,
            std=_CU_STD,
            extension=_safe_identifier(path.stem),
            stand_ins=stand_ins,
            include_dirs=[],
            extra=[],
        )
        paths = {str(source): display, **{str(src / Path(d).relative_to(path.parent)): d for d in deps}}
        # The whole result is cached below; a command-level entry would duplicate it (no key material).
        command = _Command("nvcc", argv, key_material={}, paths=paths)
        plan = _UnitPlan(name=Path(display).name, commands=[command], work=work, toolchain={}, inputs=deps)
        ran, _ = _execute([plan], cache, tools, work, deadline)
        unit = _unit_result(plan, ran[0], timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    notes = [
        "compiled with nvcc -cubin: host code is checked by the CUDA front end, not compiled by the host "
        "compiler; no object file is produced"
    ]
    notes += _stand_in_notes(_missing_library_headers(nvcc), [text, *(_read(p) for p in deps)])
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
