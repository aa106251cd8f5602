"""What can be shown on a node of ONE GPU: problem 1 with its world-size rule opened to a single rank (an
all-reduce over one rank is a copy), so paths that do not need a peer run on a real GPU in the Docker
sandbox. Run from the repository root on a GPU node (after `source .gpu/setup.sh`):

    python3 bench/scripts/one_gpu_checks.py --out one_gpu.jsonl [--parts memo profile]

Parts (each row appended to the JSONL file as soon as it is measured):
  memo      benchmarks at `pkb` and `large`: the plain memoizer and the one that burns GPU time on a hit
            (tests/adversarial/), and the honest control that keeps state across calls
            (tests/candidates/caches_state.py): the memoizers must not be credited, the control must
  profile   `pkb profile` of the reference and of examples/001_allreduce_cuda_oneshot.py: that CUPTI
            kernels are seen, correlated and categorised on a GPU, and the tool's wall time
Nothing here stands for a multi-GPU figure: communication at one rank is a local copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def emit(out: Path, row: dict) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row)[:700], flush=True)


def one_rank_problems() -> None:
    single = Path(tempfile.mkdtemp(prefix="pkb-problems-"))
    text = (ROOT / "problems" / "001_allreduce.py").read_text()
    rule = 'return None if world_size >= 2 else "needs at least 2 ranks"'
    if rule not in text:
        raise SystemExit("problem 1's world-size rule changed: update one_gpu_checks.py")
    (single / "001_allreduce.py").write_text(text.replace(rule, "return None"))
    os.environ["PKB_PROBLEMS_DIR"] = str(single)


def memo(out: Path) -> None:
    from pkb_mcp import service
    from pkb_mcp.models import RunRequest

    candidates = {
        "memoized_by_values": ROOT / "tests/adversarial/memoized_by_values.py",
        "memoized_burns_time": ROOT / "tests/adversarial/gpu/memoized_burns_time.py",
        "honest_state": ROOT / "tests/candidates/caches_state.py",
    }
    for size in ("pkb", "large"):
        for name, path in candidates.items():
            t0 = time.perf_counter()
            r = service.bench(
                RunRequest(problem=1, path=path, world_size=1, device="cuda", size=size, sandbox="docker")
            )
            roof = r.roofline
            emit(
                out,
                {
                    "part": "memo",
                    "candidate": name,
                    "size": size,
                    "verdict": r.verdict,
                    "speedup": r.speedup,
                    "fresh_speedup": r.fresh_speedup,
                    "seen_inputs_advantage": r.seen_inputs_advantage,
                    "faster_on_seen_inputs": r.faster_on_seen_inputs,
                    "below_floor": r.below_floor,
                    "fresh_calls": [s.fresh_calls if s else None for s in (r.reference, r.candidate)],
                    "pct_of_floor": roof.pct_of_floor if roof else None,
                    "message": r.message,
                    "wall_s": round(time.perf_counter() - t0, 1),
                },
            )


def profile(out: Path) -> None:
    from pkb_mcp.models import RunRequest
    from pkb_mcp.profiling import profile as pkb_profile

    for name in ("problems/001_allreduce.py", "examples/001_allreduce_cuda_oneshot.py"):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            r = pkb_profile.profile(
                RunRequest(
                    problem=1,
                    path=ROOT / name,
                    world_size=1,
                    device="cuda",
                    sandbox="docker",
                    out_dir=Path(tmp),
                )
            )
        side = r.candidate
        emit(
            out,
            {
                "part": "profile",
                "solution": name,
                "verdict": r.verdict,
                "message": r.message,
                "wall_s": round(time.perf_counter() - t0, 1),
                "candidate": side.model_dump(mode="json") if side is not None else None,
                "counters": r.counters,
            },
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("one_gpu.jsonl"))
    ap.add_argument("--parts", nargs="+", default=["memo", "profile"], choices=["memo", "profile"])
    args = ap.parse_args()
    one_rank_problems()
    for part in args.parts:
        try:
            {"memo": memo, "profile": profile}[part](args.out)
        except Exception as exc:  # one part's failure is a row, and the next part still runs
            emit(args.out, {"part": part, "error": f"{type(exc).__name__}: {exc}"[:2000]})


if __name__ == "__main__":
    main()
