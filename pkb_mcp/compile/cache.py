"""Results cached by content: JSON files named by the sha256 of what went into a build, and the local
header files a `.cu` includes (inside its own folder only, never an absolute or `..` name).

Offers `Cache` (store and load any pydantic model under a key), `cached_result` (a whole `CompileResult`,
marked as a cache hit), `local_dependencies` (the headers a source includes, with their digests, which a
hit re-checks) and `read_source` (a file's text, or "" when it cannot be read). Imports only
pkb_mcp.compile.results."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from pkb_mcp.compile.results import CompileResult

_MAX_DEPENDENCIES = 256


_Model = TypeVar("_Model", bound=BaseModel)


def _digest(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _file_digest(path: str) -> str:
    try:
        return _digest(Path(path).read_bytes())
    except OSError:
        return "missing"


class Cache:
    """JSON files named by the sha256 of what went into a build; `inputs` are files re-checked on a hit."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def key(material: dict[str, object]) -> str:
        return _digest(json.dumps(material, sort_keys=True))

    def load(self, key: str, model: type[_Model]) -> _Model | None:
        try:
            stored = json.loads((self.root / f"{key}.json").read_text(encoding="utf-8"))
            inputs: dict[str, str] = stored["inputs"]
            value = model.model_validate(stored["value"])
        except (OSError, ValueError, KeyError, TypeError, ValidationError):
            return None
        if any(_file_digest(p) != digest for p, digest in inputs.items()):
            return None
        return value

    def store(self, key: str, value: BaseModel, inputs: dict[str, str]) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            payload = json.dumps({"inputs": inputs, "value": value.model_dump(mode="json")})
            tmp = self.root / f".{key}.{os.getpid()}.{time.monotonic_ns()}.tmp"
            tmp.write_text(payload, encoding="utf-8")
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            pass  # a cache that cannot be written only costs time


def local_dependencies(
    sources: Iterable[tuple[str, Path | None]], include_dirs: Sequence[Path], root: Path | None = None
) -> dict[str, str]:
    """Files the sources include from their own folder or user include dirs: {path: sha256}.

    Only relative names that stay inside `root` count: an include of `/etc/...` or `../..` is never
    read here (the sandbox sees only the copies made of these files)."""
    found: dict[str, str] = {}
    if root is None:
        return found
    top = os.path.realpath(root)
    pending = list(sources)
    pattern = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
    while pending and len(found) < _MAX_DEPENDENCIES:
        text, base = pending.pop()
        for quote, name in pattern.findall(text):
            if os.path.isabs(name):
                continue
            bases = ([base] if quote == '"' and base is not None else []) + list(include_dirs)
            for directory in bases:
                candidate = os.path.normpath(directory / name)
                real = os.path.realpath(candidate)
                if not real.startswith(top + os.sep) or candidate in found or not os.path.isfile(real):
                    continue
                found[candidate] = _file_digest(real)
                pending.append((read_source(real), Path(candidate).parent))
                break
    return found


def cached_result(cache: Cache, key: str) -> CompileResult | None:
    """A stored result, marked (with each of its units) as a cache hit; None when not stored."""
    cached = cache.load(key, CompileResult)
    if cached is None:
        return None
    units = [u.model_copy(update={"cache_hit": True}) for u in cached.units]
    return cached.model_copy(update={"cache_hit": True, "units": units})


def read_source(path: str) -> str:
    """A file's text, undecodable bytes replaced; "" when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
