"""The communication-aware roofline: the least time a problem can take on this node.

floor = max(NVLink bytes / peer bandwidth, HBM bytes / HBM bandwidth, FLOPs / peak rate)
        + rounds x per-round latency
with the per-GPU traffic from the problem's `traffic(ctx)`; `bound` names the largest of the three
rates' terms, or `latency` where the latency term exceeds it. The exchange's share of the floor is
two fractions of floor_ms (both 0 for a floor of 0): nvlink_share = NVLink term / floor and
latency_share = latency term / floor. The NVLink term counts in full even where another term binds
(it overlaps the binding one there): nvlink_share is how much of the floor the bytes alone take,
latency_share what the dependent steps add on top. Ceilings come from the node's
calibration (a JSON file in the cache directory, written by a calibration run) when present, and
otherwise from H200 datasheet figures; the result names its source. % of floor = floor / time: 100%
is the speed of light, and a time below the floor means the traffic model or the timing is wrong.
"""

from __future__ import annotations

import json
import socket

from pkb_mcp import config
from pkb_mcp.models import Ceilings, RooflineResult, Traffic

# The exchange's least share (nvlink_share + latency_share) of a `large` floor at W = 4, unless the
# problem's file says why its workload cannot have it (MINOR_EXCHANGE, docs/problem-format.md)
MATERIAL_SHARE = 0.10

# NVIDIA H200 SXM datasheet: NVLink 4 at 900 GB/s both directions, HBM3e 4.8 TB/s, dense rates.
# The per-round latency is our assumption: about what one symmetric-memory exchange costs.
DATASHEET_H200 = Ceilings(
    nvlink_gbps=450.0,
    hbm_gbps=4800.0,
    tflops={
        "bfloat16": 989.0,
        "float16": 989.0,
        "float32": 67.0,
        "float64": 67.0,
        "complex64": 67.0,
        "int64": 67.0,
        "int32": 67.0,
    },
    round_latency_us=5.0,
    source="H200 datasheet (no calibration of this node found)",
)


def calibration_path():
    return config.cache_dir() / f"calibration-{socket.gethostname()}.json"


def from_measurements(measured: dict, when: str) -> Ceilings:
    """Ceilings from a calibration run (harness/calibrate.py): the measured peer copy, HBM copy and
    matmul rates; dtypes it did not measure and the per-round latency keep the datasheet's values."""
    rates = dict(DATASHEET_H200.tflops)
    mm = measured["matmul_tflops"]
    rates.update({"bfloat16": mm["bfloat16"], "float16": mm["bfloat16"], "float32": mm["float32"]})
    details = measured.get("details", {})
    return Ceilings(
        nvlink_gbps=measured["nvlink_gbps"],
        hbm_gbps=measured["hbm_gbps"],
        tflops=rates,
        round_latency_us=DATASHEET_H200.round_latency_us,
        source=(
            f"calibrated on {details.get('host', socket.gethostname())} at {when} "
            f"({details.get('world_size', '?')} x {details.get('gpu', details.get('device', '?'))}); "
            f"per-round latency assumed {DATASHEET_H200.round_latency_us:g} us"
        ),
    )


def save_calibration(c: Ceilings, details: dict) -> str:
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps({**c.model_dump(), "details": details}, indent=1))
    tmp.replace(path)
    return str(path)


def ceilings() -> Ceilings:
    """This node's measured ceilings when a calibration is cached, else the datasheet's."""
    path = calibration_path()
    if path.is_file():
        try:
            return Ceilings.model_validate(json.loads(path.read_text()))
        except ValueError:
            pass
    return DATASHEET_H200


def share_of(term_ms: float, floor_ms: float) -> float:
    """A term's fraction of the floor (the module docstring's shares); 0 for a floor of 0."""
    return term_ms / floor_ms if floor_ms > 0 else 0.0


def floor(
    problem_id: int,
    problem: str,
    world_size: int,
    size: str,
    traffic: dict[str, float],
    dtype: str,
    time_ms: float | None = None,
    limits: Ceilings | None = None,
) -> RooflineResult:
    c = limits or ceilings()
    t = Traffic(
        nvlink_bytes=traffic["nvlink_bytes"],
        hbm_bytes=traffic["hbm_bytes"],
        flops=traffic["flops"],
        rounds=traffic.get("rounds", 0.0),
    )
    terms = {
        "NVLink": t.nvlink_bytes / (c.nvlink_gbps * 1e9) * 1e3,
        "HBM": t.hbm_bytes / (c.hbm_gbps * 1e9) * 1e3,
        "compute": t.flops / (c.tflops.get(dtype, c.tflops["float32"]) * 1e12) * 1e3,
    }
    latency_ms = t.rounds * c.round_latency_us / 1e3
    bound = max(terms, key=lambda k: terms[k])
    floor_ms = terms[bound] + latency_ms
    if latency_ms > terms[bound]:
        bound = "latency"
    pct = None
    note = ""
    if time_ms is not None:
        if time_ms <= 0:
            raise ValueError("time must be positive")
        pct = 100.0 * floor_ms / time_ms
        if time_ms < floor_ms:
            note = "the time is below the floor: suspect the measurement or the traffic model"
    return RooflineResult(
        problem_id=problem_id,
        problem=problem,
        world_size=world_size,
        size=size,
        traffic=t,
        ceilings=c,
        nvlink_ms=terms["NVLink"],
        hbm_ms=terms["HBM"],
        compute_ms=terms["compute"],
        latency_ms=latency_ms,
        floor_ms=floor_ms,
        bound=bound,
        nvlink_share=share_of(terms["NVLink"], floor_ms),
        latency_share=share_of(latency_ms, floor_ms),
        time_ms=time_ms,
        pct_of_floor=pct,
        note=note,
    )
