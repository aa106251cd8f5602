"""The house stays clean: ruff (lint and format) and mypy pass on the code base."""

import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        [sys.executable, "-m", "mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_is_clean(command):
    if command[0] == "ruff" and shutil.which("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
