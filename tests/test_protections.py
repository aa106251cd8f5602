"""pkb's protections named (pkb_mcp/runs/protections.py): the original benchmark's rules on one rank's
outputs, and which protections failed a candidate correct by them, from hand-built launch outcomes
judged as a check judges them (no sandbox, no ranks). The end-to-end case, problem 5's file that
scatters into its input, is in tests/test_variants.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness import tensorfile
from pkb_mcp import problems
from pkb_mcp.launches import LaunchOutcome, Outputs, RankOutcome
from pkb_mcp.models import RankResult
from pkb_mcp.runs import protections
from pkb_mcp.runs.verdicts import judge_ranks, refused_timing

ORIGINAL = problems.resolve(5, "original")  # atol = rtol = 1e-2, no norm bound: the original's
PKB = problems.resolve(5)
BF16 = torch.bfloat16


def out(*tensors: torch.Tensor, structure: str = "tensor", **meta: object) -> Outputs:
    return Outputs(structure, list(tensors), dict(meta))


def launch(outputs: dict[tuple[int, int], Outputs], states: tuple[str, ...] = ("ok", "ok")) -> LaunchOutcome:
    ranks = [RankOutcome(rank=i, state=s, error="boom" if s != "ok" else "") for i, s in enumerate(states)]
    return LaunchOutcome(ranks=ranks, wall_s=1.0, timed_out=False, outputs=outputs)


def ref_and_values(trials: int = 1) -> tuple[LaunchOutcome, dict[tuple[int, int], torch.Tensor]]:
    gen = torch.Generator().manual_seed(trials)
    values = {(t, r): torch.randn(4, 8, generator=gen).to(BF16) for t in range(trials) for r in range(2)}
    return launch({k: out(v) for k, v in values.items()}), values


def named(problem, cand: LaunchOutcome, ref: LaunchOutcome, trials: int = 1):
    keys = list(range(trials))
    ranks = judge_ranks(problem, 2, keys, cand, ref)
    return protections.judged_outputs(problem, keys, cand, ref, ranks)


# ---------------------------------------------------------------- the original's rules


def test_the_original_s_rules_are_shape_and_allclose_in_float32_whatever_the_dtype():
    want = torch.randn(16, 8).to(BF16)
    tol = ORIGINAL.bounds
    assert protections.original_rules(out(want.float() + 0.004), out(want), tol) is None
    assert protections.original_rules(out(want.float()), out(want), tol) is None  # float32 for bf16
    assert "shape" in (protections.original_rules(out(want.reshape(8, 16)), out(want), tol) or "")
    assert "allclose" in (protections.original_rules(out(want + 1), out(want), tol) or "")
    nan = want.clone()
    nan[0, 0] = float("nan")
    assert protections.original_rules(out(nan), out(nan), tol) is not None  # NaN is never close
    one = out(want, structure="tuple")
    assert "outputs" in (protections.original_rules(one, out(want), tol) or "")


# ---------------------------------------------------------------- naming


def test_an_output_that_is_its_changed_input_names_aliasing_and_mutation():
    ref, values = ref_and_values()
    cand = launch(
        {
            (0, 0): out(values[(0, 0)].clone()),
            (0, 1): out(values[(0, 1)].clone(), aliased_outputs=[0], mutated_inputs=[0]),
        }
    )
    found = named(ORIGINAL, cand, ref)
    assert found is not None and protections.names(found) == ["aliasing", "mutation"]
    assert protections.message(found) == (
        "correct by the original benchmark's rules; fails pkb's: aliasing: rank 1, trial 0: output 0 "
        "shares memory with an input; mutation: rank 1, trial 0: input 0 was changed by the solution"
    )


def test_nothing_is_named_in_the_pkb_variant_or_when_nothing_failed():
    ref, values = ref_and_values()
    aliased = launch({k: out(v.clone(), aliased_outputs=[0]) for k, v in values.items()})
    assert named(PKB, aliased, ref) is None
    right = launch({k: out(v.clone()) for k, v in values.items()})
    assert named(ORIGINAL, right, ref) is None


def test_wrong_by_the_original_s_rules_too_names_nothing():
    """Aliasing and values beyond atol = rtol = 1e-2: the original fails it as well."""
    ref, values = ref_and_values()
    cand = launch({k: out(v + 1, aliased_outputs=[0]) for k, v in values.items()})
    assert named(ORIGINAL, cand, ref) is None


def test_a_later_trial_wrong_by_the_original_s_rules_names_nothing():
    """pkb stops at trial 0 (aliasing); the original would have judged trial 1 and failed it there."""
    ref, values = ref_and_values(trials=2)
    cand = launch(
        {
            **{(0, r): out(values[(0, r)].clone(), aliased_outputs=[0]) for r in range(2)},
            **{(1, r): out(values[(1, r)] + 1) for r in range(2)},
        }
    )
    assert named(ORIGINAL, cand, ref, trials=2) is None
    fixed = launch({**cand.outputs, **{(1, r): out(values[(1, r)].clone()) for r in range(2)}})
    found = named(ORIGINAL, fixed, ref, trials=2)
    assert found is not None and protections.names(found) == ["aliasing"]


def test_a_rank_that_raised_names_nothing():
    ref, values = ref_and_values()
    cand = launch({(0, 0): out(values[(0, 0)].clone(), aliased_outputs=[0])}, states=("ok", "error"))
    assert named(ORIGINAL, cand, ref) is None


def test_a_forged_output_file_names_nothing():
    ref, values = ref_and_values()
    cand = launch({k: out(v.clone(), mutated_inputs=[0], mac="forged") for k, v in values.items()})
    key = tensorfile.result_key([1])
    ranks = judge_ranks(ORIGINAL, 2, [0], cand, ref, key)
    assert all(r.state == "wrong" for r in ranks)
    assert protections.judged_outputs(ORIGINAL, [0], cand, ref, ranks, key) is None


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda v: v.float(), "dtype"),  # values exact, float32 where the reference returns bf16
        (lambda v: _with_shared_infinity(v), "nonfinite"),
    ],
)
def test_what_pkb_s_comparison_fails_and_the_original_s_passes_is_named(make, name):
    ref, values = ref_and_values()
    for k in values:
        values[k][0, 0] = float("inf") if name == "nonfinite" else values[k][0, 0]
    ref = launch({k: out(v) for k, v in values.items()})
    cand = launch({k: out(make(v)) for k, v in values.items()})
    found = named(ORIGINAL, cand, ref)
    assert found is not None and protections.names(found) == [name]


def _with_shared_infinity(v: torch.Tensor) -> torch.Tensor:
    got = v.clone()
    got[1, 1] += 0.01 * got[1, 1].abs().clamp_min(0.5)  # a difference within the bounds: not bit-equal
    return got


def test_integer_outputs_within_the_original_s_tolerance_name_exact():
    want = torch.arange(1000, 1008).reshape(2, 4)
    ref = launch({(0, r): out(want) for r in range(2)})
    cand = launch({(0, r): out(want + (r == 1)) for r in range(2)})  # off by one where 1e-2 x 1000 allows
    found = named(ORIGINAL, cand, ref)
    assert found is not None and protections.names(found) == ["exact"] and found[0].rank == 1


def test_a_norm_bound_the_original_lacks_is_named():
    bounded = dataclasses.replace(ORIGINAL, tolerance={"atol": 1e-2, "rtol": 1e-2, "rel_norm": 1e-4})
    want = torch.full((64,), 1.0, dtype=torch.float64)
    ref = launch({(0, r): out(want) for r in range(2)})
    cand = launch({(0, r): out(want * 1.005) for r in range(2)})  # each element within 1e-2
    found = named(bounded, cand, ref)
    assert found is not None and protections.names(found) == ["norm_bound"]


# ---------------------------------------------------------------- a benchmark's timed calls


def _timed(record: dict) -> tuple[LaunchOutcome, bytes]:
    key = tensorfile.result_key([7])
    cand = launch({})
    cand.timing = tensorfile.mac_record(key, record)  # type: ignore[assignment]
    return cand, key


def test_timed_outputs_and_inputs_changed_while_timed_are_named_refusals():
    passed = [RankResult(rank=r, state="pass") for r in range(2)]
    cand, key = _timed({"timed_output_mismatches": [3], "rotated_inputs": True})
    refused = refused_timing(passed, cand, key)
    assert refused is not None and refused[2] == "timed_outputs"
    found = protections.timed_calls(ORIGINAL, refused[2], refused[1])
    assert found is not None and protections.message(found).startswith(
        protections.LEAD + "timed_outputs: a timed call's output (call 3) differs"
    )
    assert protections.timed_calls(PKB, refused[2], refused[1]) is None
    cand, key = _timed({"inputs_mutated_while_timing": True})
    refused = refused_timing(passed, cand, key)
    assert refused is not None and refused[2] == "mutation"
    cand, key = _timed({"timed_output_mismatches": [1]})
    refused = refused_timing(passed, cand, tensorfile.result_key([8]))  # a forged record: not named
    assert refused is not None and refused[2] is None
    unreadable = launch({})  # no timing record, or one that did not parse: a refusal, never a pass
    refused = refused_timing(passed, unreadable, key)
    assert refused is not None and refused[0] == "fail" and "no readable timing record" in refused[1]


def test_wrong_outputs_on_fresh_input_sets_name_fresh_inputs_and_a_crash_does_not():
    cand = launch({})
    cand.fresh_outputs = {(2, 1): out(torch.zeros(3))}
    wrong = [
        RankResult(rank=0, state="pass"),
        RankResult(rank=1, trial=2, state="wrong", message="3 of 3 differ"),
    ]
    found = protections.fresh_outputs(ORIGINAL, wrong, cand)
    assert found is not None and protections.message(found) == (
        protections.LEAD + "fresh_inputs: rank 1, trial 2: wrong on a fresh input set: 3 of 3 differ"
    )
    assert protections.fresh_outputs(PKB, wrong, cand) is None
    crashed = [RankResult(rank=0, state="pass"), RankResult(rank=1, state="crashed", message="SIGSEGV")]
    assert protections.fresh_outputs(ORIGINAL, crashed, cand) is None


def test_every_name_given_is_a_listed_protection_in_the_listed_order():
    found = [protections.Breach(name, "x") for name in reversed(list(protections.PROTECTIONS))]
    assert protections.names(found) == list(protections.PROTECTIONS)
