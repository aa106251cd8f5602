"""How long the host takes to judge one rank's outputs in one trial (pkb_mcp.runs.judge.compare).

    python bench/scripts/judge_speed.py [--repeats 5]

Cases: bf16 and fp32 outputs of 1M and 16M elements, compared with an identical copy (what a
reference-as-candidate or an exact data-movement kernel gives) and with a copy off by about one
bf16 step (what a reduction in another order gives). One JSON line per case: the median, in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from pkb_mcp.runs.judge import Outputs, compare

TOL = {"atol": 5e-2, "rtol": 5e-2, "rel_norm": 5e-2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1 << 20, 1 << 24):
            want = torch.randn(n, generator=gen).to(dtype)
            cases = {"identical": want.clone(), "perturbed": (want.float() * (1 + 2**-7)).to(dtype)}
            for name, got in cases.items():
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    r = compare(0, 0, Outputs("tensor", [got], {}), Outputs("tensor", [want], {}), TOL)
                    times.append((time.perf_counter() - t0) * 1e3)
                row = {
                    "dtype": str(dtype)[6:],
                    "elements": n,
                    "case": name,
                    "verdict": r.state,
                    "median_ms": round(statistics.median(times), 2),
                    "threads": torch.get_num_threads(),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
