"""`pkb --help` and `pkb problems` start without torch and the other heavy libraries: they run nothing,
so they answer in under a second (bench/scripts/cli_startup.py measures it:
bench/cpu-runs/2026-12-02/cli_startup.md)."""

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.fast

# what none of these commands needs: torch (seconds to import), and the sandbox's and the server's
HEAVY = ("torch", "numpy", "docker", "mcp", "anyio", "harness", "sandbox", "pkb_mcp.service")


def imported(*args: str) -> set[str]:
    """The modules `python -m pkb_mcp ARGS` imports, from `-X importtime`'s lines on stderr."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pkb_mcp", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}


@pytest.mark.parametrize("args", [("--help",), ("problems",), ("problems", "--text", "ring", "--json")])
def test_commands_that_run_nothing_import_no_heavy_library(args):
    modules = imported(*args)
    assert "pkb_mcp.frontends.cli" in modules, "the measurement saw the command's imports"
    assert [m for m in HEAVY if m in modules] == []
