import math

import torch

from pkb_mcp.launches import Outputs
from pkb_mcp.runs.judge import compare

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
    assert "tuple or list of 2" in compare(0, 0, out(ref, ref), out(ref), TOL).message


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
    from pkb_mcp.runs.verdicts import decide as _verdict

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
    import pkb_mcp.runs.judge

    monkeypatch.setattr(pkb_mcp.runs.judge, "CHUNK", 4)
    ref = torch.randn(12, dtype=torch.float64)
    got = ref.clone()
    got[8:] *= 1.001  # only the last chunk differs
    r = compare(0, 0, out(got), out(ref), TOL)
    want = float((got - ref).norm() / ref.norm())
    assert r.state == "pass" and math.isclose(r.rel_norm_error, want, rel_tol=1e-9)
    assert math.isclose(r.max_abs_error, float((got - ref).abs().max()), rel_tol=1e-9)


def test_a_large_output_cannot_hide_an_error_in_a_small_one():
    """Issue 17: pooled over both outputs, 2% off in the small one is 0.0002 in norm and passed; each
    output on its own bounds, it is 0.02 of its own norm and fails, naming the output."""
    big = torch.randn(10_000, dtype=torch.float64) * 100
    small = torch.randn(100, dtype=torch.float64)
    tol = {"atol": 1.0, "rtol": 0.1, "rel_norm": 0.005}
    r = compare(0, 0, out(big.clone(), small * 1.02), out(big, small), tol)
    assert r.state == "wrong" and r.mismatched == 0, "every element is inside the elementwise bounds"
    assert "relative error norm of output 1 0.02 exceeds 0.005" in r.message
    assert math.isclose(r.rel_norm_error, 0.02, rel_tol=1e-9), "the largest per-output figure"


def test_an_output_may_have_bounds_of_its_own():
    total = torch.tensor([5000.0], dtype=torch.float64)
    grads = torch.randn(1000, dtype=torch.float64)
    tol = {**TOL, "outputs": {0: {"atol": 0.0, "rtol": 1e-4, "rel_norm": 1e-4}}}
    off = total * (1 + 1e-3)  # 0.1%: inside the default rtol, outside output 0's own
    r = compare(0, 0, out(off, grads.clone()), out(total, grads), tol)
    assert r.state == "wrong" and r.first_mismatch.output == 0 and "rtol 0.0001" in r.message
    assert compare(0, 0, out(off, grads.clone()), out(total, grads), TOL).state == "pass"
    json_keys = {**TOL, "outputs": {"0": tol["outputs"][0]}}  # the worker reads the bounds from JSON
    assert compare(0, 0, out(off, grads.clone()), out(total, grads), json_keys).state == "wrong"


def test_an_all_zero_reference_output_is_judged_elementwise_only():
    zeros = torch.zeros(16, dtype=torch.float64)
    ones = torch.ones(16, dtype=torch.float64)
    r = compare(0, 0, out(ones.clone(), zeros + 0.001), out(ones, zeros), TOL)
    assert r.state == "pass" and r.rel_norm_error == 0.0, "output 1 has no norm; output 0 is exact"
    assert compare(0, 0, out(ones.clone(), zeros + 0.1), out(ones, zeros), TOL).state == "wrong"


def test_timed_rechecks_use_each_output_s_bounds():
    from harness.timing import output_bounds, outputs_match

    tol = {**TOL, "outputs": {"1": {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}}}
    assert output_bounds(tol, 0) is tol and output_bounds(tol, 1)["rtol"] == 0.0
    a, b = torch.randn(8), torch.randn(8)
    assert outputs_match([a + 0.001, b.clone()], [a, b], tol)
    assert not outputs_match([a.clone(), b + 0.001], [a, b], tol), "output 1 is bit-exact"


def test_complex_bounds_apply_to_the_modulus_of_the_difference():
    from harness.timing import outputs_match

    ref = torch.zeros(4, dtype=torch.complex128)
    bounds = {"atol": 1.0, "rtol": 0.0, "rel_norm": math.inf}
    inside = ref + complex(0.7, 0.7)  # each part within atol, |difference| = 0.99
    outside = ref + complex(0.75, 0.75)  # each part within atol, |difference| = 1.06
    assert compare(0, 0, out(inside), out(ref), bounds).state == "pass"
    assert compare(0, 0, out(outside), out(ref), bounds).state == "wrong"
    assert outputs_match([inside], [ref], bounds) and not outputs_match([outside], [ref], bounds)


def test_a_header_that_differs_is_named_as_compare_would_its_flags_first():
    """A candidate file refused from its header (issue 49: no data read) gets compare's message: an
    output aliasing an input or a changed input first, then the header's difference."""
    from harness import tensorfile
    from pkb_mcp.runs import judge as judging

    differs = "output 0 is bfloat16[8, 1024], expected float32[8, 1024]"
    assert judging.header_mismatch(tensorfile.Mismatch(differs)) == differs
    mutated = tensorfile.Mismatch(differs, {"mutated_inputs": ["vocab_parallel_logits"]})
    assert (
        judging.header_mismatch(mutated)
        == "vocab_parallel_logits was changed by the solution; inputs are read-only"
    )
    aliased = tensorfile.Mismatch(differs, {"aliased_outputs": [0], "mutated_inputs": [1]})
    assert judging.header_mismatch(aliased) == "output 0 shares memory with an input; return new tensors"
