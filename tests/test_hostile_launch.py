"""A candidate that turns what the host reads from its launch into a trap, in the Docker sandbox as
CI runs it: its rank log swapped for a link to the server's environment or to /dev/zero, or for a
FIFO; its output folder swapped for a link to a host folder. The host reads nothing of the host,
never blocks, and fails the check with one sentence naming what was swapped (sandbox/untrusted.py).
The same swaps on every file and folder the host reads are fast tests in tests/test_untrusted.py and
tests/test_launch_results.py."""

import json
import os
import time

import pytest

from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import docker_client

CLIENT = docker_client()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("small_docker_limits"),
    pytest.mark.skipif(CLIENT is None, reason="no Docker engine answers"),
]

CANARY = "pkb-canary-token-5d41402abc4b2a76"

# a right all-reduce that, on rank 0, swaps a file the host will read for a trap
SWAPS = """import os
import torch
import torch.distributed as dist

def solution(x):
    if dist.get_rank() == 0:
        target = {target!r}
        if os.path.isdir(target) and not os.path.islink(target):
            os.rename(target, target + ".old")
        elif os.path.lexists(target):
            os.unlink(target)
        {make}
    out = x.clone()
    dist.all_reduce(out)
    return out
"""

TRAPS = {
    "link to the server's environment": "os.symlink('/proc/self/environ', target)",
    "link to /dev/zero": "os.symlink('/dev/zero', target)",
    "FIFO": "os.mkfifo(target)",
}


@pytest.mark.parametrize("trap", list(TRAPS))
def test_a_rank_log_swapped_for_a_trap_fails_the_check_and_brings_back_nothing(trap, tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_TOKEN", CANARY)  # what /proc/self/environ of the host would give
    path = tmp_path / "swaps.py"
    path.write_text(SWAPS.format(target="/launch/rank0.log", make=TRAPS[trap]))
    t0 = time.monotonic()
    r = service.check(RunRequest(problem=1, path=str(path), device="cpu", sandbox="docker", world_size=2))
    assert time.monotonic() - t0 < 120, "the host must not block on what the candidate left"
    assert r.verdict == "fail", r.message
    assert "rank0.log was replaced by" in r.message, r.message
    assert CANARY not in json.dumps(r.model_dump(mode="json"))


def test_an_output_folder_swapped_for_a_link_to_a_host_folder_is_never_followed(tmp_path):
    """out/ replaced by a link to a host folder whose output file is a FIFO: a host that followed the
    link would block opening it, past every deadline. The ranks lose their own outputs (the link
    leads nowhere inside the container), so the check fails, and within its time."""
    host = tmp_path / "host-folder"
    host.mkdir()
    os.mkfifo(host / "t0_r0.pkbt")
    path = tmp_path / "swaps_out.py"
    path.write_text(SWAPS.format(target="/launch/out", make=f"os.symlink({str(host)!r}, target)"))
    t0 = time.monotonic()
    r = service.check(RunRequest(problem=1, path=str(path), device="cpu", sandbox="docker", world_size=2))
    assert time.monotonic() - t0 < 120, "the host must not follow out/ to a FIFO"
    assert r.verdict == "fail", r.message


def test_a_candidate_that_fills_the_disk_is_stopped_at_its_launch_folder_s_limit(tmp_path, monkeypatch):
    """Before: one passing check wrote about 20 GiB to the host's disk. The folder's limit here is
    64 MiB; the candidate writes until it is stopped (a disk of any size would be filled)."""
    monkeypatch.setenv("PKB_LAUNCH_DISK", "64m")
    path = tmp_path / "fills_disk.py"
    path.write_text(
        "import os, time\nimport torch.distributed as dist\n\ndef solution(x):\n"
        "    block = b'x' * (4 << 20)\n"
        "    with open(f'/launch/fill{dist.get_rank()}', 'wb') as f:\n"
        "        for _ in range(4096):\n            f.write(block)\n            time.sleep(0.01)\n"
        "    return x\n"
    )
    r = service.check(
        RunRequest(problem=1, path=str(path), device="cpu", sandbox="docker", world_size=2, timeout_s=120)
    )
    assert r.verdict == "fail", r.message
    assert "launch folder's limit of 0.0625 GiB" in r.message, r.message
