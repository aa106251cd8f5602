"""The host parses Python text one thread at a time (pkb_mcp/python_text.py): CPython 3.11 before
3.11.8 shares the AST constructor's recursion count between threads, and CI saw `SystemError: AST
constructor recursion depth mismatch` from `pkb eval` parsing while its jobs ran."""

from __future__ import annotations

import ast
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from pkb_mcp import python_text

PACKAGE = Path(__file__).resolve().parents[1] / "pkb_mcp"


def test_two_threads_never_parse_at_once(monkeypatch):
    inside, overlaps = [0], []
    real = ast.parse

    def slow_parse(source, filename="<unknown>"):
        inside[0] += 1
        overlaps.append(inside[0] > 1)
        time.sleep(0.02)  # long enough for the other thread to enter, were it let in
        inside[0] -= 1
        return real(source, filename=filename)

    monkeypatch.setattr(python_text, "ast", SimpleNamespace(parse=slow_parse))
    threads = [threading.Thread(target=python_text.parse, args=("x = 1\n",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlaps) == 4 and not any(overlaps)


def test_no_host_module_parses_but_through_the_lock():
    calls = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\bast\.parse\(", path.read_text())
    }
    assert calls == {"python_text.py"}, calls
