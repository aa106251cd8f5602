"""Right answer, and on every call writes forged result files where the host will look (the job
directory is its working directory): a timing record of 0.000123 ms samples, a launch report with
every rank ok, and its own status file.

Everything it writes is written again afterwards by the harness (the timing record and the status
at the end of the job) or by the launcher (its report), and a timing record without the harness's
keyed digest would be rejected anyway. Expected: check and bench pass with the harness's own
figures: no forged sample reaches the result.
"""

import json
from pathlib import Path

import torch.distributed as dist

FORGED_MS = 0.000123


def _forge():
    job = Path.cwd()
    rank = dist.get_rank()
    record = {
        "device_ms": [FORGED_MS] * 77,
        "wall_ms": [FORGED_MS] * 77,
        "warmup_calls": 3,
        "stop_reason": "precision reached",
        "timed_output_mismatches": [],
        "input_sets": 2,
        "clock": "host perf_counter",
        "alignment_sleep_us": 0.0,
    }
    (job / "timing.json").write_text(json.dumps(record))
    ranks = [{"rank": r, "state": "ok", "exit_code": 0} for r in range(dist.get_world_size())]
    (job / "launch.json").write_text(json.dumps({"ranks": ranks, "wall_s": 0.1, "timed_out": False}))
    (job / f"rank{rank}.status.json").write_text(json.dumps({"state": "ok", "elapsed_s": 0.1}))


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    _forge()
    return out
