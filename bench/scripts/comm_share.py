"""Every problem's floor at `large`, W = 2 and 4: what binds it, the exchange's share of it, and the
reference's time estimated from bytes and FLOPs (issue 53: a `large` size whose exchange is not a
material part of its floor either changes or says why it cannot).

The floor and its shares are the roofline's (pkb_mcp/roofline.py, docs/measurement.md "Roofline"), at
the datasheet ceilings `pkb roofline` uses without a calibration. The reference's estimate is the same
traffic at the H200's measured ceilings (docs/problem-format.md, "Sizes": NVLink 395 GB/s, HBM 4.26
TB/s, bf16 790 TFLOP/s; other dtypes and the 5 us a round the datasheet's) with the terms added, not
overlapped, as a reference that runs its collectives and its compute one after the other takes them.
It is an estimate until a GPU run measures it. `exchange` = NVLink share + latency share; rows under
--material (roofline.MATERIAL_SHARE, 10%) at W = 4 are marked `<`, and `stated` where the problem's
file says why its exchange cannot be material (MINOR_EXCHANGE; tests/test_comm_share.py).

    python3 bench/scripts/comm_share.py [--world-sizes 2 4] [--material 0.10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pkb_mcp import problems, roofline  # noqa: E402
from pkb_mcp.models import Ceilings, RooflineResult  # noqa: E402
from pkb_mcp.problems import Problem  # noqa: E402

MEASURED_H200 = roofline.DATASHEET_H200.model_copy(
    update={
        "nvlink_gbps": 395.0,
        "hbm_gbps": 4260.0,
        "tflops": {**roofline.DATASHEET_H200.tflops, "bfloat16": 790.0, "float16": 790.0},
        "source": "H200 measured (docs/problem-format.md)",
    }
)


def floor_at(p: Problem, world_size: int, limits: Ceilings) -> RooflineResult:
    traffic = p.traffic(world_size, "large")
    return roofline.floor(p.id, p.name, world_size, "large", traffic, p.dtype, limits=limits)


def reference_estimate_ms(p: Problem, world_size: int) -> float:
    """The reference's time from its bytes and FLOPs, the terms one after the other (the docstring)."""
    r = floor_at(p, world_size, MEASURED_H200)
    return r.nvlink_ms + r.hbm_ms + r.compute_ms + r.latency_ms


def row(p: Problem, world_size: int, material: float) -> tuple[str, bool]:
    """The problem's line at `world_size`, and whether its exchange is under `material` at W = 4."""
    why = p.world_size_error(world_size, "large")
    if why:
        return f"{p.id:3d}  {p.name[:30]:30s}  W{world_size}  not run: {why}", False
    r = floor_at(p, world_size, roofline.DATASHEET_H200)
    exchange = r.nvlink_share + r.latency_share
    under = world_size == 4 and exchange < material
    line = (
        f"{p.id:3d}  {p.name[:30]:30s}  W{world_size}  {r.floor_ms:8.3f}  {r.bound:8s}  "
        f"{100 * r.nvlink_share:6.2f}%  {100 * r.latency_share:6.2f}%  {100 * exchange:6.2f}% "
        f"{'<' if under else ' '}  {reference_estimate_ms(p, world_size):8.3f}"
        + ("  stated" if p.minor_exchange else "")
    )
    return line, under


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--material", type=float, default=roofline.MATERIAL_SHARE, help="the exchange's least share at W = 4"
    )
    args = parser.parse_args()
    print(f"{'id':>3s}  {'problem':30s}  W   floor ms  bound     NVLink   latency  exchange    ref est ms")
    under = []
    for p in problems.suite().values():
        for w in args.world_sizes:
            line, below = row(p, w, args.material)
            under += [p.id] if below else []
            print(line)
    stated = [pid for pid in under if problems.resolve(pid).minor_exchange]
    print(f"exchange under {100 * args.material:g}% of the floor at W = 4: {under}; stated why: {stated}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
