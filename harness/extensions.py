"""Extensions that solutions build with `torch.utils.cpp_extension.load_inline`: built once, then loaded.

A `Request` is everything that decides what a `load_inline` call builds (name, source strings, flags)
plus the toolchain it is built with; its `key` (sha256) names the build. Three places use it:

- inside a candidate's launch, `install()` replaces `load_inline`: a build found in the launch's own
  view of the node's extension cache (PKB_EXTENSIONS: the entries of this launch's own requests, which
  the host put there one by one, read-only) is loaded from there; otherwise the launch builds it
  itself, once for all of its ranks (the first rank to take the lock builds, the others wait and load);
- in a build launch (harness/build.py, no candidate code), `build()` compiles a request into a directory
  without loading it (loading runs the extension's initializers, which are candidate code), one unit at
  a time through the node's object cache (harness/objects.py), every step as argv (no shell);
- on the host, pkb_mcp/compile/extensions.py computes the same keys (the request's, its units'
  objects', its header's: `unit_keys`, `header_key`, `part_index`) to decide what to build, what a
  launch may see and what of a build launch's output it installs.

Only the host writes the cache, and only under keys it computed for the requests it asked a build
launch for, so a candidate's launch never changes what another launch loads (docs/sandbox.md).
Stdlib + torch only: this runs inside the sandbox.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import headers, objects

SCHEMA = 1
# the launch's own view of the node's extension cache (its requests' entries, read-only; the layout
# of the cache: <key>/, objects/<key>.o, objects/headers/<key>/, objects/prefixes/<key>/)
CACHE_ENV = "PKB_EXTENSIONS"
VIEW = ".pkb-cache"  # that view's folder in the launch directory (the host's, read-only to the launch)
OK_MARK = "ok.json"  # written last by a successful build: the directory is complete
FAILED_MARK = "failed.json"  # a build that failed, with the compiler's output
UNITS_MARK = (
    "units.json"  # which units a build took from the object cache, which it compiled, and how long each took
)
NAME_RE = re.compile(r"[A-Za-z_]\w{0,99}")
MAX_SOURCE_CHARS = 4 << 20
MAX_FLAGS = 64
MAX_FLAG_CHARS = 1000
FAILURE_LOG_CHARS = 20_000


class RequestError(ValueError):
    """A request that is malformed or too large to build or cache."""


@dataclass(frozen=True)
class Request:
    """What decides the result of one `load_inline` call."""

    name: str
    cpp_sources: tuple[str, ...]
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] | None = None
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    with_cuda: bool | None = None
    is_python_module: bool = True
    with_pytorch_error_handling: bool = True
    no_implicit_headers: bool = False

    def key(self, toolchain: dict[str, str]) -> str:
        material = {"schema": SCHEMA, "request": self.to_json(), "toolchain": toolchain}
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: Any) -> Request:
        """A request from untrusted JSON: checked field by field, bounded in size."""
        if not isinstance(data, dict):
            raise RequestError("an extension request must be an object")

        def strings(field: str, limit: int) -> tuple[str, ...]:
            value = data.get(field) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RequestError(f"{field} must be a list of strings")
            if len(value) > limit:
                raise RequestError(f"{field} has more than {limit} entries")
            return tuple(value)

        def flag(field: str, default: bool | None) -> bool | None:
            value = data.get(field, default)
            if value is not None and not isinstance(value, bool):
                raise RequestError(f"{field} must be true, false or null")
            return value

        functions = data.get("functions")
        request = cls(
            name=str(data.get("name", "")),
            cpp_sources=strings("cpp_sources", 256),
            cuda_sources=strings("cuda_sources", 256),
            functions=None if functions is None else strings("functions", 1024),
            extra_cflags=strings("extra_cflags", MAX_FLAGS),
            extra_cuda_cflags=strings("extra_cuda_cflags", MAX_FLAGS),
            extra_ldflags=strings("extra_ldflags", MAX_FLAGS),
            with_cuda=flag("with_cuda", None),
            is_python_module=bool(flag("is_python_module", True)),
            with_pytorch_error_handling=bool(flag("with_pytorch_error_handling", True)),
            no_implicit_headers=bool(flag("no_implicit_headers", False)),
        )
        request.validate()
        return request

    def validate(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise RequestError(f"extension name {self.name[:40]!r} is not a Python identifier")
        if sum(len(s) for s in (*self.cpp_sources, *self.cuda_sources)) > MAX_SOURCE_CHARS:
            raise RequestError(f"extension {self.name}: its sources exceed {MAX_SOURCE_CHARS} characters")
        flags = (*self.extra_cflags, *self.extra_cuda_cflags, *self.extra_ldflags)
        if any(len(f) > MAX_FLAG_CHARS for f in flags):
            raise RequestError(f"extension {self.name}: a flag is longer than {MAX_FLAG_CHARS} characters")
        if any(not NAME_RE.fullmatch(f) for f in self.functions or ()):
            raise RequestError(f"extension {self.name}: functions= must name C++ functions")


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def request_of(
    name: Any,
    cpp_sources: Any,
    cuda_sources: Any = None,
    functions: Any = None,
    extra_cflags: Any = None,
    extra_cuda_cflags: Any = None,
    extra_ldflags: Any = None,
    with_cuda: Any = None,
    is_python_module: Any = True,
    with_pytorch_error_handling: Any = True,
    no_implicit_headers: Any = False,
) -> Request:
    """The request of a `load_inline` call's arguments (functions as a list; a dict's docstrings are
    not kept, so such a call is built by torch itself, uncached)."""
    request = Request(
        name=str(name),
        cpp_sources=_strings(cpp_sources),
        cuda_sources=_strings(cuda_sources),
        functions=None if functions is None else _strings(functions),
        extra_cflags=_strings(extra_cflags),
        extra_cuda_cflags=_strings(extra_cuda_cflags),
        extra_ldflags=_strings(extra_ldflags),
        with_cuda=None if with_cuda is None else bool(with_cuda),
        is_python_module=bool(is_python_module),
        with_pytorch_error_handling=bool(with_pytorch_error_handling),
        no_implicit_headers=bool(no_implicit_headers),
    )
    request.validate()
    return request


def _file_id(path: str | None) -> str:
    if not path:
        return "absent"
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return "absent"
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


def toolchain(env: dict[str, str] | None = None) -> dict[str, str]:
    """What besides the request decides the build: torch, Python, the CUDA and C++ compilers, the GPU
    architectures. The host (same interpreter and /usr) computes the same from the launch's environment."""
    import torch

    env = dict(os.environ) if env is None else env
    cuda_home = env.get("CUDA_HOME", "")
    cxx = env.get("CXX", "c++")
    cxx_path = cxx if os.path.isabs(cxx) else shutil.which(cxx, path="/usr/local/bin:/usr/bin:/bin")
    return {
        "torch": str(torch.__version__),
        "torch_cuda": str(torch.version.cuda),
        "python": ".".join(map(str, sys.version_info[:3])),
        "machine": platform.machine(),
        "arch_list": env.get("TORCH_CUDA_ARCH_LIST", ""),
        "nvcc": _file_id(os.path.join(cuda_home, "bin", "nvcc")) if cuda_home else "absent",
        "cxx": _file_id(cxx_path),
    }


def unit_texts(request: Request) -> dict[str, str]:
    """The units `load_inline` would write for this request, by file name, C++ first: their text."""
    cpp = list(request.cpp_sources)
    if not request.no_implicit_headers:
        cpp.insert(0, "#include <torch/extension.h>")
    if request.functions is not None:
        wrap = request.with_pytorch_error_handling
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for f in request.functions:
            target = f"torch::wrap_pybind_function({f})" if wrap else f
            cpp.append(f'm.def("{f}", {target}, "{f}");')
        cpp.append("}")
    texts = {CPP_UNIT: "\n".join(cpp)}
    if request.cuda_sources:
        cuda = list(request.cuda_sources)
        if not request.no_implicit_headers:
            cuda[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        texts[CUDA_UNIT] = "\n".join(cuda)
    return texts


def source_files(request: Request, directory: Path) -> list[str]:
    """Write the files `load_inline` would write for this request; their paths, C++ first."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in unit_texts(request).items():
        paths.append(directory / name)
        paths[-1].write_text(text)
    return [str(p) for p in paths]


CPP_UNIT, CUDA_UNIT = "main.cpp", "cuda.cu"
# the request's fields that only decide the other unit's text, or only the link (each unit's key
# leaves them out: two requests that differ in their link flags share their units' objects)
_ONLY_TEXT_OF = {
    CPP_UNIT: ("cuda_sources", "extra_ldflags"),
    CUDA_UNIT: ("cpp_sources", "functions", "with_pytorch_error_handling", "extra_ldflags"),
}


def with_cuda(request: Request) -> bool:
    """Whether torch builds the request with CUDA (its own default: when it has CUDA sources)."""
    return request.with_cuda if request.with_cuda is not None else bool(request.cuda_sources)


def unit_keys(request: Request, toolchain: dict[str, str]) -> dict[str, str]:
    """Each unit's object key (harness/objects.py `object_key`), by file name: its text and the
    request's fields but those that only write the other unit. The host computes these to know which
    objects a build launch of this request may add to the cache, and which it may see."""
    keys = {}
    for unit, text in unit_texts(request).items():
        fields = {k: v for k, v in request.to_json().items() if k not in _ONLY_TEXT_OF[unit]}
        fields["with_cuda"] = with_cuda(request)
        keys[unit] = objects.object_key(unit, text, fields, toolchain)
    return keys


def header_key(request: Request, toolchain: dict[str, str]) -> str:
    """The key of the precompiled torch header the request's C++ unit may use (harness/headers.py)."""
    return headers.key(list(request.extra_cflags), with_cuda(request), toolchain)


_LEADING = re.compile(r"\s*(#\s*include\b.*|//.*)?")


def part_index(request: Request, toolchain: dict[str, str]) -> str | None:
    """A host-computable name for the headers' part (harness/prefixes.py) the request's CUDA unit will
    likely use: sha256 of its leading lines (blank, comment and #include lines before its own code),
    its CUDA flags and the toolchain. The part's own key is over the text cudafe++ writes, which only
    a build learns; the host keeps which part a build of this name reported, and lets the next build
    of the same name see that part alone (a build still takes it only where its key is its own).
    None for a request without a CUDA unit."""
    text = unit_texts(request).get(CUDA_UNIT)
    if text is None:
        return None
    leading = []
    for line in text.splitlines():
        if not _LEADING.fullmatch(line):
            break
        leading.append(line)
    material = {
        "schema": SCHEMA,
        "leading": leading,
        "extra_cuda_cflags": list(request.extra_cuda_cflags),
        "with_cuda": with_cuda(request),
        "toolchain": toolchain,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


# what a flag of a build launch may be made of: no blank, quote, backslash, $, backtick, ;, |, &, <,
# >, parentheses or newline, so that no shell (nvcc runs its own steps through one) reads more into it
SAFE_FLAG = re.compile(r"[A-Za-z0-9_=+,.:/%@-]+")


def unsafe_flag(request: Request) -> str | None:
    """The first flag of the request that is not plain text for a shell (SAFE_FLAG), or None. The host
    allow-lists a build launch's flags already (pkb_mcp/compile/flags.py); a build launch checks again."""
    for flag in (*request.extra_cflags, *request.extra_cuda_cflags, *request.extra_ldflags):
        if not SAFE_FLAG.fullmatch(flag):
            return flag
    return None


UNPLANNED = "not built by a build launch: "  # how a build launch's log says it left a request alone


class Unplanned(RuntimeError):
    """A request a build launch does not build (torch's own builder would run its steps through a
    shell, or a flag is not plain text): the candidate's launch builds it, in its own sandbox. Its
    message starts with UNPLANNED, which the host reads as "left to the launch", not as a failure."""


def _write_build_file(request: Request, sources: list[str], directory: Path) -> None:
    """torch's own build file for these sources (its flags, include paths and link line), unrun."""
    from torch.utils import cpp_extension

    with_cuda = request.with_cuda if request.with_cuda is not None else bool(request.cuda_sources)
    prepare = cpp_extension._prepare_ldflags
    ld_args: dict[str, Any] = {
        "extra_ldflags": list(request.extra_ldflags),
        "with_cuda": with_cuda,
        "with_sycl": False,
        "verbose": False,
        "is_standalone": False,
    }
    ldflags = prepare(**{k: v for k, v in ld_args.items() if k in inspect.signature(prepare).parameters})
    writer = cpp_extension._write_ninja_file_to_build_library
    kwargs: dict[str, Any] = {
        "path": str(directory / "build.ninja"),
        "name": request.name,
        "sources": sources,
        "extra_cflags": list(request.extra_cflags),
        "extra_cuda_cflags": list(request.extra_cuda_cflags),
        "extra_sycl_cflags": [],
        "extra_ldflags": ldflags,
        "extra_include_paths": [],
        "with_cuda": with_cuda,
        "with_sycl": False,
        "is_standalone": False,
    }
    writer(**{k: v for k, v in kwargs.items() if k in inspect.signature(writer).parameters})


def _build_with_torch(request: Request, sources: list[str], directory: Path, verbose: bool) -> None:
    """torch's builder (ninja over the whole build file), for a build file harness/objects.py does not run."""
    from torch.utils import cpp_extension

    builder = cpp_extension._write_ninja_file_and_build_library
    params = inspect.signature(builder).parameters
    kwargs: dict[str, Any] = {
        "name": request.name,
        "sources": sources,
        "extra_cflags": list(request.extra_cflags),
        "extra_cuda_cflags": list(request.extra_cuda_cflags),
        "extra_sycl_cflags": None,
        "extra_ldflags": list(request.extra_ldflags),
        "extra_include_paths": [],
        "build_directory": str(directory),
        "verbose": verbose,
        "with_cuda": request.with_cuda,
        "with_sycl": None,
        "is_standalone": False,
    }
    builder(**{k: v for k, v in kwargs.items() if k in params})


def build_steps(request: Request, sources: list[str], directory: Path) -> list[objects.Step] | None:
    """The compile steps and the link of torch's build file for these sources (written into
    `directory`), or None for a torch whose private build helpers differ (its own builder runs)."""
    try:
        _write_build_file(request, sources, directory)
        return objects.plan(directory / "build.ninja")
    except (objects.PlanError, AttributeError, TypeError, KeyError):
        return None


def build(
    request: Request,
    directory: Path,
    verbose: bool = False,
    store: Path | None = None,
    steps_s: dict[str, float] | None = None,
) -> Path:
    """Compile and link the request in `directory` without loading it; the shared library's path.

    Each unit's object comes from the launch's view of the object cache when it is there
    (harness/objects.py); `store` (a build launch's) receives the objects compiled here. Raises
    RuntimeError with the compiler's output when the build fails, Unplanned in a build launch (`store`
    given) for a build file harness/objects.py does not run. `steps_s` receives how long the plan took
    (the sources and torch's build file written, read back) and the compiles and link after it."""
    start = time.monotonic()
    sources = source_files(request, directory)
    steps = build_steps(request, sources, directory)
    planned = time.monotonic()
    if steps_s is not None:
        steps_s["plan"] = round(planned - start, 3)
    if steps is None and store is not None:
        raise Unplanned(f"{UNPLANNED}torch's build file for {request.name} is not one objects.py runs")
    if steps is None:
        _build_with_torch(request, sources, directory, verbose)
    else:
        cache = os.environ.get(CACHE_ENV)
        chain = toolchain()
        try:
            done = objects.run(
                steps,
                directory,
                chain,
                Path(cache) / objects.OBJECTS if cache else None,
                store,
                unit_keys(request, chain),
                header_key(request, chain),
            )
        except RuntimeError as exc:
            raise RuntimeError(f"Error building extension '{request.name}': {exc}") from None
        mark: dict[str, Any] = {"cached": done.cached, "compiled": done.compiled, "seconds": done.seconds}
        parts = [asdict(part) for part in done.parts]
        mark |= {"precompiled": done.precompiled, "parts": parts, "chains": done.chains}
        write_mark(directory, UNITS_MARK, mark)
    if steps_s is not None:
        steps_s["compile"] = round(time.monotonic() - planned, 3)
    library = directory / f"{request.name}.so"
    if not library.is_file():
        raise RuntimeError(f"building extension {request.name} left no {library.name}")
    return library


def load_library(request: Request, library: Path) -> Any:
    """What `load_inline` returns for a built library: the module, or its path for a library of ops."""
    if not request.is_python_module:
        import torch

        torch.ops.load_library(str(library))
        return str(library)
    spec = importlib.util.spec_from_file_location(request.name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension {request.name} from {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_mark(directory: Path, mark: str) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / mark).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_mark(directory: Path, mark: str, data: dict[str, Any]) -> None:
    part = directory / (mark + ".part")
    part.write_text(json.dumps(data))
    os.replace(part, directory / mark)


# load_inline's arguments a request records; any other argument given a non-default value (sycl
# sources, a build directory, include paths, a precompiled header, docstrings in `functions`) makes
# the call torch's own, uncached
KEPT_ARGUMENTS = (
    "name",
    "cpp_sources",
    "cuda_sources",
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_ldflags",
    "with_cuda",
    "is_python_module",
    "with_pytorch_error_handling",
    "no_implicit_headers",
)


class _Loader:
    """The `load_inline` a candidate's launch sees."""

    KEPT = KEPT_ARGUMENTS
    IGNORED = ("verbose", "keep_intermediates")

    def __init__(self, cache: Path | None, scratch: Path, original: Any) -> None:
        self.cache, self.scratch, self.original = cache, scratch, original
        self.signature = inspect.signature(original)
        self._toolchain: dict[str, str] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)  # a TypeError here is the one torch would raise
        given = bound.arguments
        defaults = {n: p.default for n, p in self.signature.parameters.items()}
        unusual = [n for n, v in given.items() if n not in self.KEPT + self.IGNORED and v != defaults.get(n)]
        if unusual or isinstance(given.get("functions"), dict):
            return self.original(*args, **kwargs)
        try:
            request = request_of(**{n: v for n, v in given.items() if n in self.KEPT})
        except RequestError:
            return self.original(*args, **kwargs)
        if self._toolchain is None:
            self._toolchain = toolchain()
        key = request.key(self._toolchain)
        verbose = bool(given.get("verbose", False))
        if self.cache is not None:
            cached = self.cache / key
            failed = read_mark(cached, FAILED_MARK)
            if failed is not None:
                why = str(failed.get("log", ""))[-FAILURE_LOG_CHARS:]
                raise RuntimeError(f"Error building extension '{request.name}': {why}")
            if read_mark(cached, OK_MARK) is not None:
                return load_library(request, cached / f"{request.name}.so")
        return self._build_here(request, key, verbose)

    def _build_here(self, request: Request, key: str, verbose: bool) -> Any:
        """Build in this launch, once for all ranks: the rank holding the lock builds, the rest wait."""
        directory = self.scratch / key
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                failed = read_mark(directory, FAILED_MARK)
                if failed is not None:
                    raise RuntimeError(str(failed.get("log", "")))
                if read_mark(directory, OK_MARK) is None:
                    try:
                        build(request, directory, verbose)
                    except Exception as exc:
                        write_mark(directory, FAILED_MARK, {"log": str(exc)[-FAILURE_LOG_CHARS:]})
                        raise
                    write_mark(directory, OK_MARK, {"name": request.name})
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return load_library(request, directory / f"{request.name}.so")


CPP_EXTENSION = "torch.utils.cpp_extension"


def _route(cpp_extension: Any) -> None:
    cache = os.environ.get(CACHE_ENV)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / "pkb-extensions"
    cpp_extension.load_inline = _Loader(Path(cache) if cache else None, scratch, cpp_extension.load_inline)


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds torch.utils.cpp_extension once, through the other finders, and routes its load_inline as
    soon as the module has run: a solution that never imports it never pays its import (setuptools
    and all, a good part of a second per rank)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != CPP_EXTENSION:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _route(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Route the solution's `load_inline` calls through the extension cache (before it is imported):
    at once if torch.utils.cpp_extension is loaded, else when something first imports it."""
    loaded = sys.modules.get(CPP_EXTENSION)
    if loaded is not None:
        _route(loaded)
    else:
        sys.meta_path.insert(0, _RouteOnImport())
