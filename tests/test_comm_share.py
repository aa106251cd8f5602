"""Every `large` size has an exchange that matters, or its file says why it cannot (issue 53).

At `large`, W = 4, at the datasheet's ceilings (what `pkb roofline` shows without a calibration), the
exchange's share of the floor (NVLink + latency, pkb_mcp/roofline.py) is at least MATERIAL_SHARE, or the
problem states MINOR_EXCHANGE; and a problem that states it is really below (no stale statement).
Shapes and traffic only: nothing is allocated.
"""

from __future__ import annotations

import pytest

from pkb_mcp import problems, roofline
from pkb_mcp.problems import Problem

SUITE = problems.suite()
W = 4


def exchange_share(p: Problem) -> float:
    traffic = p.traffic(W, "large")
    r = roofline.floor(p.id, p.name, W, "large", traffic, p.dtype, limits=roofline.DATASHEET_H200)
    return r.nvlink_share + r.latency_share


@pytest.mark.parametrize("pid", sorted(SUITE))
def test_a_large_size_s_exchange_is_material_or_its_file_says_why_not(pid):
    p = SUITE[pid]
    assert p.world_size_error(W, "large") is None, "every problem runs at large on 4 GPUs"
    share = exchange_share(p)
    if p.minor_exchange is None:
        assert share >= roofline.MATERIAL_SHARE, (
            f"problem {pid}: the exchange is {100 * share:.2f}% of the large floor at W = {W}: choose a "
            "size where it matters, or state MINOR_EXCHANGE (docs/problem-format.md)"
        )
    else:
        assert share < roofline.MATERIAL_SHARE, (
            f"problem {pid}: MINOR_EXCHANGE is stale: the exchange is {100 * share:.1f}% of the floor"
        )


def test_the_statement_reaches_show_and_a_problem_without_one_has_none():
    from pkb_mcp import render, service

    stated = service.show_problem(25, W, "large")
    assert stated.minor_exchange == SUITE[25].minor_exchange and "float32" in stated.minor_exchange
    assert f"why the exchange stays minor at any size: {stated.minor_exchange}" in render.show(stated)
    plain = service.show_problem(1, W, "large")
    assert plain.minor_exchange is None and "stays minor" not in render.show(plain)


@pytest.mark.parametrize("value", ["", "   ", 3, ["a sentence"]])
def test_a_malformed_minor_exchange_is_refused_naming_the_file(tmp_path, value):
    bad = tmp_path / "025_importance_sampling_loss.py"
    bad.write_text(SUITE[25].path.read_text() + f"\nMINOR_EXCHANGE = {value!r}\n")  # the last one wins
    with pytest.raises(
        problems.ProblemFormatError, match=r"025_importance_sampling_loss\.py: MINOR_EXCHANGE"
    ):
        problems.load_problem(bad)
