"""Warm tool sandboxes (harness/launch.py `_warm_tool`, pkb_mcp/launches.py `ToolLaunches`): a build
launch's sandbox started ahead, its launcher with torch and the build program imported, serving one
tool launch; the pool keeps them apart from the shapes of ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkb_mcp.launches import TOOL_SHAPE, ToolLaunches, enable_warm_pool
from sandbox.base import CONFIG_NAME, warm_setup, write_config
from sandbox.pool import WarmKey

from .conftest import ROOT, docker_client, wait_for
from .test_warm_pool import fake_pool, ready_at_once


def test_tool_sandboxes_are_not_counted_among_the_shapes_of_ranks(isolated_dirs):
    started: list[WarmKey] = []
    pool = fake_pool(
        isolated_dirs, ready_at_once(started), per_key=lambda key: 1 if not key.world_size else 2
    )
    pool.max_keys = 1
    first, second = WarmKey("cpu", (), 2, 1), WarmKey("cpu", (), 4, 1)
    pool.replenish(first)
    pool.replenish(TOOL_SHAPE)
    pool.replenish(second)  # the least recently used shape of ranks goes, the tool sandbox stays
    wait_for(lambda: len(started) == 5, 10, "five started")
    assert set(pool._slots) == {TOOL_SHAPE, second}
    slot = pool.take(TOOL_SHAPE)
    assert slot is not None and slot.ready(), "a tool sandbox has no ranks to wait for"
    pool.close()


def _launcher(launch_dir: Path) -> subprocess.Popen[str]:
    setup = warm_setup(launch_dir, 0, "cpu", 1)
    argv = [sys.executable, "-m", "harness.launch", "--config-file", str(launch_dir / CONFIG_NAME)]
    return subprocess.Popen(
        [*argv, "--warm", json.dumps(setup)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_warm_tool_launcher_runs_the_build_launch_it_is_given(tmp_path):
    proc = _launcher(tmp_path)
    time.sleep(0.5)
    (tmp_path / "in.txt").write_text("what the host wrote")
    command = {"argv": ["cat", "in.txt"], "cwd": str(tmp_path)}
    write_config(
        tmp_path, {"mode": "build", "launch_dir": str(tmp_path), "timeout_s": 60, "commands": [command]}
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    record = json.loads((tmp_path / "launch.json").read_text())
    assert record["tool"] == "build" and record["exit_code"] == 0
    built = json.loads((tmp_path / "build.json").read_text())
    assert built["commands"][0]["output"] == "what the host wrote" and built["import_s"] < 1, built
    assert not (tmp_path / CONFIG_NAME).exists(), "read and deleted"


def test_a_warm_tool_launcher_refuses_a_launch_of_ranks(tmp_path):
    from .test_sandbox_records import launch_config

    proc = _launcher(tmp_path)
    write_config(tmp_path, launch_config(tmp_path, mode="outputs"))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "does not fit a warm tool sandbox" in err
    assert not (tmp_path / "launch.json").exists()


@pytest.mark.integration
@pytest.mark.usefixtures("small_docker_limits")
@pytest.mark.skipif(docker_client() is None, reason="no Docker engine answers")
def test_a_build_launch_takes_a_warm_container_with_what_its_caller_wrote(isolated_dirs):
    """The pool starts a tool sandbox with itself and another as soon as one is taken; each build
    takes one, whose directory becomes the caller's, with the caller's files in it; nothing is left
    behind."""
    from sandbox.docker import DockerBackend

    from .test_sandbox_docker import assert_clean

    backend = DockerBackend(docker_client())
    pool = enable_warm_pool(backend)
    assert pool is not None
    try:
        tools = ToolLaunches(backend)
        warm = []
        for i in range(2):
            wait_for(lambda: bool(pool._slots.get(TOOL_SHAPE)), 120, "a warm tool sandbox")
            launch_dir = tools.new_dir()
            (launch_dir / "in.txt").write_text(f"input {i}")
            command = {"argv": ["cat", "in.txt"], "cwd": str(launch_dir)}
            outcome = tools.run("build", launch_dir, {"commands": [command]}, 120)
            built = json.loads((launch_dir / "build.json").read_text())
            assert outcome.exit_code == 0 and built["commands"][0]["output"] == f"input {i}", outcome.log
            warm.append(outcome.warm)
            assert os.path.isdir(launch_dir)
            shutil.rmtree(launch_dir)
        assert warm == [True, True]
    finally:
        backend.disable_pool()
    assert_clean(isolated_dirs)
