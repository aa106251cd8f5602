import math

import torch

from pkb_mcp.judge import Outputs, compare

TOL = {"atol": 0.01, "rtol": 0.01, "rel_norm": 0.01}
EXACT = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}


def out(*tensors, structure="tuple", **meta):
    return Outputs(structure, list(tensors), meta)


def test_identical_outputs_pass():
    ref = torch.randn(8, 8)
    r = compare(0, 0, out(ref.clone()), out(ref), TOL)
    assert r.state == "pass" and r.max_abs_error == 0 and r.rel_norm_error == 0


def test_elementwise_mismatch_names_first_index_and_values():
    ref = torch.randn(4, 6)
    got = ref.clone()
    got[2, 3] += 5
    r = compare(1, 3, out(got), out(ref), TOL)
    assert r.state == "wrong" and r.rank == 1 and r.trial == 3
    assert r.first_mismatch is not None and r.first_mismatch.index == [2, 3] and r.mismatched == 1
    assert math.isclose(r.max_abs_error, 5, rel_tol=1e-6)


def test_relative_norm_catches_small_uniform_error():
    ref = torch.randn(1000, dtype=torch.float64)
    r = compare(0, 0, out(ref * 1.009), out(ref), {"atol": 0.1, "rtol": 0.1, "rel_norm": 0.005})
    assert r.state == "wrong" and "relative error norm" in r.message


def test_nan_never_passes_even_with_huge_tolerance():
    ref = torch.randn(5)
    got = ref.clone()
    got[1] = float("nan")
    assert compare(0, 0, out(got), out(ref), {"atol": 1e9, "rtol": 1e9, "rel_norm": 1e9}).state == "wrong"


def test_shape_dtype_and_structure_must_match_exactly():
    ref = torch.randn(4, 4, dtype=torch.bfloat16)
    assert "float32" in compare(0, 0, out(ref.float()), out(ref), TOL).message
    assert "[16]" in compare(0, 0, out(ref.reshape(16)), out(ref), TOL).message
    assert "tuple of 2" in compare(0, 0, out(ref, ref), out(ref), TOL).message


def test_exact_problems_and_integers_tolerate_nothing():
    ref = torch.randn(100, dtype=torch.bfloat16)
    got = ref.clone()
    got.view(torch.int16)[7] += 1  # the next representable bf16 value: one unit in the last place
    assert compare(0, 0, out(got), out(ref), EXACT).state == "wrong"
    ints = torch.arange(10)
    assert compare(0, 0, out(ints + (ints == 4)), out(ints), TOL).first_mismatch.index == [4]


def test_complex_outputs_compare_both_parts():
    ref = torch.randn(16, dtype=torch.complex64)
    got = ref.clone()
    got[3] = got[3] + 1j
    assert compare(0, 0, out(got), out(ref), TOL).first_mismatch.index == [3]


def test_aliasing_and_mutation_flags_fail_whatever_the_values():
    ref = torch.randn(3)
    assert "shares memory" in compare(0, 0, out(ref, aliased_outputs=[0]), out(ref), TOL).message
    assert "was changed" in compare(0, 0, out(ref, mutated_inputs=[0]), out(ref), TOL).message


def test_the_verdict_leads_with_the_root_cause_not_the_rank_that_lost_its_peer():
    from pkb_mcp.models import RankResult
    from pkb_mcp.service import _verdict

    collateral = RankResult(
        rank=0,
        state="error",
        ended_s=1.0,
        message="raised RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1",
    )
    cause = RankResult(rank=1, state="error", ended_s=1.0, message="raised RuntimeError: rank 1 gives up")
    exited = RankResult(rank=1, state="exited", ended_s=1.02, message="exited with status 0 before finishing")
    assert _verdict([collateral, cause]) == ("fail", "rank 1: raised RuntimeError: rank 1 gives up")
    assert "exited" in _verdict([collateral, exited])[1]


def test_error_norm_counts_every_chunk_identical_or_not(monkeypatch):
    """Bit-identical chunks take a shortcut; the relative error norm is still over the whole output."""
    import pkb_mcp.judge

    monkeypatch.setattr(pkb_mcp.judge, "CHUNK", 4)
    ref = torch.randn(12, dtype=torch.float64)
    got = ref.clone()
    got[8:] *= 1.001  # only the last chunk differs
    r = compare(0, 0, out(got), out(ref), TOL)
    want = float((got - ref).norm() / ref.norm())
    assert r.state == "pass" and math.isclose(r.rel_norm_error, want, rel_tol=1e-9)
    assert math.isclose(r.max_abs_error, float((got - ref).abs().max()), rel_tol=1e-9)
