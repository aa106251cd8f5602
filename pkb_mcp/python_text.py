"""Python source read as text on the host: the one parser every host-side reader of a solution or a
problem file calls (a candidate is never imported on the host; DESIGN.md's threat model).

CPython 3.11 before 3.11.8 keeps the AST constructor's recursion count in one process-wide struct
(python/cpython#106905), so two threads that parse at once may see `SystemError: AST constructor
recursion depth mismatch`: the server's and `pkb eval`'s worker threads parse candidates side by
side. Parsing under one lock costs nothing measurable (a solution parses in about a millisecond)."""

from __future__ import annotations

import ast
import threading

_PARSING = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one thread at a time; SyntaxError or ValueError (a NUL byte) as ast.parse raises."""
    with _PARSING:
        return ast.parse(source, filename=filename)
