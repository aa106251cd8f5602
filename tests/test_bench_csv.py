"""bench/scripts/bench_csv.py: the benchmark rows of gpu_report.py's JSONL files as the CSV that
docs/gpu-results.md cites."""

import csv
import importlib.util
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scripts" / "bench_csv.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_csv", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def side(median, iqr, **extra):
    return {"median_ms": median, "iqr_ms": iqr, **extra}


def test_refs_and_examples_rows_become_csv_rows_others_do_not(tmp_path):
    rows = [
        {"part": "machine", "date": "2026-11-26T05:34:46+00:00"},
        {
            "part": "refs",
            "problem": 30,
            "solution": "problems/030_x.py",
            "world_size": 2,
            "size": "pkb",
            "verdict": "pass",
            "speedup": 0.99354,
            "speedup_low": 0.968,
            "speedup_high": 1.021,
            "pct_of_floor": 25.79,
            "bound": "latency",
            "warnings": [],
            "reference": side(0.02, 0.001, launches=1, replay_advantage=1.0123),
            "candidate": side(0.0198, 0.001),
        },
        {"part": "examples-check", "problem": 72, "verdict": "pass", "wall_s": 15.3},
        {
            "part": "examples",
            "problem": 72,
            "solution": "examples/072_y.py",
            "world_size": 2,
            "size": "large",
            "verdict": "pass",
            "speedup": 1.2832,
            "pct_of_floor": 6.4,
            "warnings": ["w"],
            "reference": side(3.191, 0.0),
            "candidate": side(2.487, 0.01),
        },
    ]
    day = tmp_path / "2026-11-26"
    day.mkdir()
    (day / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = io.StringIO()
    with redirect_stdout(out):
        load().main(["--root", str(tmp_path), str(day / "r.jsonl")])
    got = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [(r["part"], r["problem"]) for r in got] == [("refs", "30"), ("examples", "72")]
    refs, example = got
    assert refs["date"] == "2026-11-26" and refs["call"] == "2026-11-26/r.jsonl"
    assert refs["solution"] == "" and example["solution"] == "072_y.py"
    assert refs["speedup"] == "0.9935" and refs["ref_iqr_pct"] == "5" and refs["launches"] == "1"
    assert refs["ref_replay_advantage"] == "1.012" and example["ref_replay_advantage"] == ""
    assert example["speedup_low"] == "" and example["warnings"] == "1" and example["ref_iqr_pct"] == "0"
