"""Outputs with non-tensor parts: the encoding (harness/structure.py), the result file that carries
it, and the host's judgement of it (pkb_mcp/runs/judge.py)."""

import json
import math
import struct

import pytest
import torch

from harness import structure, tensorfile
from harness.calls import SolutionError, normalize_output
from pkb_mcp.launches import Outputs
from pkb_mcp.runs.judge import compare

TOL = {"atol": 1e-3, "rtol": 1e-3, "rel_norm": 1e-3}


def mixed_output():
    """Problem 25's shape (a tuple with None and a 0-dim loss), 28's torch.Size, 70's dict."""
    return (
        torch.tensor(0.5),
        None,
        torch.Size([4, 8]),
        {"counts": 3, "values": torch.arange(5), "scale": 0.25, "name": "kjt", "ok": True},
        [torch.ones(2), float("nan"), -7],
    )


def test_mixed_outputs_round_trip_through_the_result_file(tmp_path):
    shape, tensors = normalize_output(mixed_output())
    assert [t.shape for t in tensors] == [torch.Size([]), torch.Size([5]), torch.Size([2])]
    assert shape[0] == "tuple" and shape[1][1] == ["none"] and shape[1][2] == ["size", [4, 8]]
    assert [k for k, _ in shape[1][3][1]] == ["counts", "name", "ok", "scale", "values"], "keys sorted"
    path = tmp_path / "o.pkbt"
    key = tensorfile.result_key([7])
    tensorfile.save(path, tensors, shape, {"aliased_outputs": []}, key=key)
    loaded, back, meta = tensorfile.load(path, 1 << 20)
    assert loaded == shape and tensorfile.verify(key, loaded, back, meta)
    assert all(torch.equal(a, b) for a, b in zip(back, tensors, strict=True))
    names = structure.tensor_names(structure.tree(loaded, len(back)))
    assert names == ["output 0", "output 3['values']", "output 4[0]"]
    # the plain forms stay as they were
    assert normalize_output(torch.ones(2))[0] == "tensor"
    assert normalize_output([torch.ones(2), torch.ones(1)])[0] == "tuple"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (object(), "object, which the harness cannot judge"),
        ({1: torch.ones(1)}, "keys are not all strings"),
        ("x" * (structure.MAX_STR + 1), "longer than"),
        (1 << 64, "outside 64 bits"),
        ((((((((((((torch.ones(1),),),),),),),),),),),), "nested deeper"),
    ],
)
def test_what_cannot_be_judged_breaks_the_contract(value, words):
    with pytest.raises(SolutionError, match=words):
        normalize_output(value)


def _forge(path, header):
    raw = json.dumps(header).encode()
    path.write_bytes(tensorfile.MAGIC + struct.pack("<Q", len(raw)) + raw + b"\0" * 16)


ONE = [{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}]


@pytest.mark.parametrize(
    ("shape", "tensors", "words"),
    [
        (["tuple", [["tensor"], ["tensor"]]], ONE, "holds 2 tensors"),
        (["none", 1], ONE, "malformed output structure"),
        (["int", 1 << 70], [], "malformed output structure"),
        (["int", 1.5], [], "malformed output structure"),
        (["float", "not hex"], [], "malformed output structure"),
        (["str", "x" * 1000], [], "malformed output structure"),
        (["dict", [["b", ["none"]], ["a", ["none"]]]], [], "malformed output structure"),
        (["dict", [["a", ["none"]], ["a", ["none"]]]], [], "malformed output structure"),
        (["size", [-1]], [], "malformed output structure"),
        (["pickle", "x"], [], "malformed output structure"),
        ({"kind": "tensor"}, ONE, "malformed output structure"),
        ("tensor", [], "holds 1 tensors"),
        (["tuple", [["none"]] * (structure.MAX_ITEMS + 1)], [], "malformed output structure"),
        (["tuple", [["tuple", [["none"]] * 200]] * 200], [], "too large"),
    ],
)
def test_the_host_refuses_malformed_and_oversized_structures(tmp_path, shape, tensors, words):
    path = tmp_path / "bad.pkbt"
    _forge(path, {"structure": shape, "tensors": tensors, "meta": {}})
    with pytest.raises(tensorfile.TensorFileError, match=words):
        tensorfile.load(path, 1 << 22)


def test_a_structure_nested_past_the_decoder_is_refused(tmp_path):
    path = tmp_path / "deep.pkbt"
    raw = ('{"structure": ' + '["tuple", [' * 5000 + '["none"]' + "]]" * 5000 + ', "tensors": []}').encode()
    path.write_bytes(tensorfile.MAGIC + struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(tensorfile.TensorFileError):
        tensorfile.load(path, 1 << 22)


def outputs(value) -> Outputs:
    shape, tensors = normalize_output(value)
    return Outputs(shape, [t.clone() for t in tensors], {})


def test_the_judge_compares_non_tensor_parts_exactly_and_says_where():
    want = outputs(mixed_output())
    assert compare(0, 0, outputs(mixed_output()), want, TOL).state == "pass"
    cases = [
        (lambda o: (o[0], torch.zeros(1), *o[2:]), "output 1: expected None, got tensor"),
        (
            lambda o: (*o[:2], torch.Size([4, 9]), *o[3:]),
            "output 2: expected torch.Size([4, 8]), got torch.Size([4, 9])",
        ),
        (lambda o: (*o[:3], {**o[3], "counts": 4}, o[4]), "output 3['counts']: expected int 3, got int 4"),
        (
            lambda o: (*o[:3], {**o[3], "counts": 3.0}, o[4]),
            "output 3['counts']: expected int 3, got float 3.0",
        ),
        (lambda o: (*o[:3], {**o[3], "ok": 1}, o[4]), "output 3['ok']: expected bool True, got int 1"),
        (lambda o: (*o[:3], {**o[3], "extra": 1}, o[4]), "output 3: expected a dict with keys"),
        (lambda o: (*o[:4], [o[4][0], 0.0, -7]), "output 4[1]: expected float nan, got float 0.0"),
        (lambda o: o[:4], "the output: expected a tuple or list of 5, got a tuple or list of 4"),
    ]
    for change, words in cases:
        got = compare(0, 0, outputs(change(mixed_output())), want, TOL)
        assert got.state == "wrong" and got.message.startswith(words), (words, got.message)
    # tensors inside are named by their place, and judged on their bounds as before
    off = mixed_output()
    off[3]["values"] = torch.arange(5) + 1
    got = compare(0, 0, outputs(off), want, TOL)
    assert got.state == "wrong" and "first at output 3['values'] index [0]" in got.message
    assert got.first_mismatch is not None and got.first_mismatch.output == 1


def test_flags_from_a_file_are_named_and_bounded():
    want = outputs(mixed_output())
    aliased = Outputs(want.structure, want.tensors, {"aliased_outputs": [2]})
    assert compare(0, 0, aliased, want, TOL).message.startswith("output 4[0] shares memory with an input")
    named = Outputs(want.structure, want.tensors, {"mutated_inputs": ["input 3 (Linear) parameter weight"]})
    assert compare(0, 0, named, want, TOL).message.startswith("input 3 (Linear) parameter weight was changed")
    long = Outputs(want.structure, want.tensors, {"mutated_inputs": ["x" * 10_000]})
    assert len(compare(0, 0, long, want, TOL).message) < 300
    older = Outputs(want.structure, want.tensors, {"mutated_inputs": [1]})
    assert compare(0, 0, older, want, TOL).message.startswith("input 1 was changed")


def test_floats_keep_their_exact_value():
    for x in (0.1, -0.0, math.inf, 1e-310):
        (shape, _) = normalize_output((x, None))
        assert float.fromhex(shape[1][0][1]) == x or math.isnan(x)
    assert normalize_output((-0.0, None))[0] != normalize_output((0.0, None))[0], "the sign of zero counts"


def test_decode_rebuilds_what_encode_read():
    value = mixed_output()
    shape, tensors = normalize_output(value)
    back = structure.decode(shape, tensors)
    assert back[1] is None and back[2] == torch.Size([4, 8]) and back[3]["scale"] == 0.25
    assert back[3]["values"] is tensors[1] and back[4][0] is tensors[2] and math.isnan(back[4][1])
    assert structure.encode(back) == (shape, tensors)
    assert structure.decode("tensor", tensors[:1]) is tensors[0]
    assert structure.decode("tuple", tensors) == tuple(tensors)


def sorted_rows(outputs, inputs):
    """A canonical order: rows sorted by their first column (ties broken by the second)."""
    rows, count = outputs
    key = rows[:, 0] * 1000 + rows[:, 1]
    return rows[key.argsort()], count


def canonical_calls(hook):

    from harness.calls import Calls

    calls = Calls.__new__(Calls)
    calls.canonical = hook
    return calls


def test_the_canonical_order_applies_to_the_returned_outputs_only_the_in_place_follow():
    rows = torch.tensor([[2.0, 1.0], [0.0, 5.0], [2.0, 0.0]])
    in_place = torch.ones(3)
    shape, outs = normalize_output((rows, 3))
    calls = canonical_calls(sorted_rows)
    new_shape, ordered = calls.judged_form(shape, [*outs, in_place], 1, (rows,))
    assert new_shape == ["tuple", [["tensor"], ["int", 3], ["tensor"]]] and ordered[1] is in_place
    assert ordered[0].tolist() == [[0.0, 5.0], [2.0, 0.0], [2.0, 1.0]]
    assert canonical_calls(None).judged_form(shape, outs, 1, ()) == (shape, outs)


def test_a_canonical_order_that_cannot_read_the_outputs_fails_the_call():
    shape, outs = normalize_output(torch.zeros(3))  # a tensor where the hook wants (rows, count)
    with pytest.raises(SolutionError, match="canonical order could not be applied"):
        canonical_calls(sorted_rows).judged_form(shape, outs, 1, ())


def test_a_solution_that_replaces_the_canonical_order_fails_the_rank():
    from types import ModuleType

    from harness.worker import Watch

    problem = ModuleType("pkb_problem")
    problem.canonical = sorted_rows  # type: ignore[attr-defined]
    watch = Watch(problem)
    watch.check("before")
    problem.canonical = lambda outputs, inputs: outputs  # type: ignore[attr-defined]
    with pytest.raises(SolutionError, match=r"replaced the problem\.canonical"):
        watch.check("during a call")


def sparse(indices, values, size=(4, 3)):
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), size)


def test_a_sparse_output_is_coalesced_and_round_trips(tmp_path):
    # uncoalesced: (1, 0) twice, out of order
    out = sparse([[1, 0, 1], [0, 2, 0]], [1.0, 2.0, 3.0])
    shape, tensors = normalize_output((out, torch.ones(2)))
    assert shape == ["tuple", [["sparse", [4, 3]], ["tensor"]]]
    assert tensors[0].tolist() == [[0, 1], [2, 0]] and tensors[1].tolist() == [2.0, 4.0]
    assert structure.tensor_names(shape) == [
        "output 0 (sparse indices)",
        "output 0 (sparse values)",
        "output 1",
    ]
    path = tmp_path / "o.pkbt"
    tensorfile.save(path, tensors, shape, {})
    loaded, back, _ = tensorfile.load(path, 1 << 20)
    assert loaded == shape and len(back) == 3
    rebuilt = structure.decode(loaded, back)[0]
    assert rebuilt.is_coalesced() and torch.equal(rebuilt.to_dense(), out.to_dense())
    with pytest.raises(SolutionError, match="sparse_csr"):
        normalize_output(out.to_dense().to_sparse_csr())


def test_the_judge_compares_a_sparse_pattern_exactly_and_its_values_on_the_bounds():
    want = Outputs(*normalize_output(sparse([[0, 1], [2, 0]], [2.0, 4.0])), {})

    def judged(indices, values, size=(4, 3)):
        return compare(0, 0, Outputs(*normalize_output(sparse(indices, values, size)), {}), want, TOL)

    assert judged([[1, 0, 1], [0, 2, 0]], [1.0, 2.0, 3.0]).state == "pass"  # the same, uncoalesced
    assert judged([[0, 1], [2, 0]], [2.0, 4.0001]).state == "pass"
    r = judged([[0, 1], [2, 0]], [2.0, 4.5])
    assert r.state == "wrong" and "output 0 (sparse values)" in r.message
    r = judged([[0, 1], [2, 1]], [2.0, 4.0])
    assert r.state == "wrong" and "output 0 (sparse indices)" in r.message
    r = judged([[0, 1, 2], [2, 0, 0]], [2.0, 4.0, 0.0])  # an explicit zero is a different pattern
    assert r.state == "wrong" and "int64[2, 3], expected int64[2, 2]" in r.message
    r = judged([[0, 1], [2, 0]], [2.0, 4.0], (5, 3))
    assert r.state == "wrong" and "expected a sparse tensor of size [4, 3]" in r.message


@pytest.mark.parametrize(
    ("shape", "tensors", "want"),
    [
        ("tensor", 1, "tuple"),
        ("tuple", 2, "tuple"),
        (["tuple", [["tensor"], ["none"]]], 1, ["tuple", [["tensor"], ["none"], ["tensor"], ["tensor"]]]),
        (
            ["dict", [["a", ["tensor"]]]],
            1,
            ["tuple", [["dict", [["a", ["tensor"]]]], ["tensor"], ["tensor"]]],
        ),
    ],
)
def test_in_place_outputs_follow_the_returned_ones_in_the_structure(shape, tensors, want):
    extended = structure.extended(shape, tensors, 2)
    assert extended == want and structure.extended(shape, tensors, 0) == shape
    if extended != "tuple":
        assert structure.check(extended) == tensors + 2
