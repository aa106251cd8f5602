"""A failed extension build as a run reports it: a message that leads with the compiler's first errors
(`parse.first_errors`), each mapped to the solution file's line where its source string can be found
there, instead of the torch build log's command lines.

A check, a benchmark or a profile (pkb_mcp/runs/) hands each failed rank's error to `build_failure`
with the `SolutionSources` of its run; the message starts with `BUILD_FAILED`, which is how a result
tells a failed build from any other error (`pkb eval`'s outcome `build`).

Offers `BUILD_FAILED`, `SolutionSources` and `build_failure`. Imports pkb_mcp.compile.parse and units,
and harness.extensions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness import extensions as requests
from pkb_mcp.compile.parse import first_errors
from pkb_mcp.compile.results import Diagnostic
from pkb_mcp.compile.units import LineMap

BUILD_FAILED = "failed to build extension"
# torch's message, also raised in a launch for a build the extension cache holds as failed
_TORCH_FAILED = re.compile(r"Error building extension '(?P<name>[^']{1,100})'")
_CUDA_PREFIX_LINES = 3  # the headers load_inline writes above cuda_sources (harness/extensions.source_files)
_CPP_PREFIX_LINES = 1  # and above cpp_sources


@dataclass
class SolutionSources:
    """A solution's text and the extension builds it asks for: what maps a generated file's line
    (cuda.cu, main.cpp) back to the solution's."""

    display: str  # the solution's name in messages
    text: str
    builds: Sequence[requests.Request] = ()
    logs: dict[str, str] = field(default_factory=dict)  # compiler output of builds that failed before the run

    def locate(self, extension: str, d: Diagnostic) -> Diagnostic:
        """`d` at the solution's line when its file is one that load_inline generated for `extension`
        and the source string is found in the solution; else as it is."""
        build = next((b for b in self.builds if b.name == extension), None)
        if build is None or d.file not in ("cuda.cu", "main.cpp") or d.line is None:
            return d
        cuda = d.file == "cuda.cu"
        chunks = list(build.cuda_sources if cuda else build.cpp_sources)
        prefix = 0 if build.no_implicit_headers else (_CUDA_PREFIX_LINES if cuda else _CPP_PREFIX_LINES)
        label = f"{extension}/{'cuda' if cuda else 'cpp'}_sources"
        line_map = LineMap(d.file, prefix, chunks, self.text.splitlines(), self.display, label)
        file, line = line_map.map(d.line)
        return d.model_copy(update={"file": file, "line": line})


def build_failure(error: str, sources: SolutionSources | None = None, limit: int = 3) -> str | None:
    """The message of a rank whose extension failed to build (`error`: its exception and traceback
    text), leading with the compiler's first errors; None when `error` is not a failed build."""
    m = _TORCH_FAILED.search(error)
    if m is None:
        return None
    name = m["name"]
    # the log kept from the build before the run is whole; a rank's error text is trimmed
    log = (sources.logs.get(name) if sources is not None else None) or error
    errors = first_errors(log, limit)
    head = f"{BUILD_FAILED} '{name}'"
    if not errors:
        return f"{head} (the compiler's output named no error line; see the rank's traceback)"
    if sources is not None:
        errors = [sources.locate(name, d) for d in errors]
    return f"{head}: " + "\n".join(d.one_line() for d in errors)
