"""`pkb calibrate`: the measuring code runs end to end (a CPU dry run, which saves nothing), and the
roofline takes a saved calibration's ceilings over the datasheet's."""

import json

import pytest

from pkb_mcp import roofline, service
from pkb_mcp.frontends.cli import main


@pytest.mark.integration
@pytest.mark.slow
def test_cpu_dry_run_measures_everything_and_saves_nothing(isolated_dirs, capsys):
    assert main(["calibrate", "--device", "cpu", "--world-size", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved_to"] is None
    assert not roofline.calibration_path().exists()
    d = out["details"]
    assert d["hbm_copy_gbps"] > 0 and d["matmul_tflops"]["bfloat16"] > 0
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert d["collectives"][name]["busbw_gbps"] > 0
    assert d["collectives"]["small_all_reduce_us"] > 0


def test_a_saved_calibration_replaces_the_datasheet(isolated_dirs):
    before = service.roofline_of(1, 4, "pkb")
    assert "datasheet" in before.ceilings.source
    measured = {
        "nvlink_gbps": 395.0,
        "hbm_gbps": 4260.0,
        "matmul_tflops": {"bfloat16": 790.0, "float32": 50.0},
        "details": {"host": "node", "world_size": 4, "gpu": "NVIDIA H200"},
    }
    c = roofline.from_measurements(measured, "2026-11-22 00:00 UTC")
    roofline.save_calibration(c, measured["details"])
    after = service.roofline_of(1, 4, "pkb")
    assert after.ceilings.nvlink_gbps == 395.0 and after.ceilings.tflops["bfloat16"] == 790.0
    assert "calibrated on node" in after.ceilings.source
    # allreduce is NVLink-bound: a slower measured link raises the floor by the ratio of the ceilings
    assert after.nvlink_ms == pytest.approx(before.nvlink_ms * 450.0 / 395.0)


def test_calibration_needs_two_ranks():
    from pkb_mcp.errors import UserError

    with pytest.raises(UserError, match="at least 2 ranks"):
        service.calibrate(1, "cpu")
