"""What the harness checks of a call's inputs: module arguments' parameters and buffers in the
aliasing and mutation checks, and lean inputs fingerprinted instead of copied (harness/calls.py);
the host's share of a call in the timing statistics (pkb_mcp/runs/stats.py)."""

import pytest
import torch

from harness import calls
from harness.calls import Pristine, aliased_inputs, fingerprint, input_tensors
from pkb_mcp.runs import stats


def module_inputs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    norm = torch.nn.BatchNorm1d(3)
    return (torch.randn(2, 4), [torch.ones(2), 5], lin, norm, torch.Size([2, 3]))


def test_module_parameters_and_buffers_are_named_inputs():
    names = [n for n, _ in input_tensors(module_inputs())]
    assert names[:4] == [
        "input 0",
        "input 1[0]",
        "input 2 (Linear) parameter weight",
        "input 2 (Linear) parameter bias",
    ]
    assert "input 3 (BatchNorm1d) buffer running_mean" in names


@pytest.mark.parametrize("lean", [False, True])
def test_a_changed_module_parameter_is_caught_and_named(lean):
    inputs = module_inputs()
    pristine = Pristine(inputs, 1234 if lean else None)
    assert pristine.changed(inputs) == []
    with torch.no_grad():
        inputs[2].weight[1, 2] += 1e-3
    assert pristine.changed(inputs) == ["input 2 (Linear) parameter weight"]
    inputs = module_inputs()
    pristine = Pristine(inputs, 1234 if lean else None)
    inputs[3].running_mean.add_(1)  # a buffer: the BatchNorm's statistics
    inputs[1][0].mul_(2)  # a tensor inside a list argument
    assert pristine.changed(inputs) == ["input 1[0]", "input 3 (BatchNorm1d) buffer running_mean"]
    inputs[2].weight = torch.nn.Parameter(torch.zeros(5, 4))  # a replaced parameter
    assert "input 2 (Linear) parameter weight" in pristine.changed(inputs)


def test_an_output_sharing_a_parameter_is_aliased():
    inputs = module_inputs()
    assert aliased_inputs([inputs[2].weight.detach().view(-1), torch.zeros(3)], list(inputs)) == [0]
    assert aliased_inputs([inputs[2].weight.detach().clone()], list(inputs)) == []


def test_lean_inputs_keep_no_copy_and_catch_a_one_bit_change(monkeypatch):
    big = torch.randn(calls.FINGERPRINT_CHUNK // 2 + 3)  # two chunks and a bit
    inputs = (big, torch.nn.Linear(3, 2))
    clones = []
    real_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: clones.append(t) or real_clone(t, *a, **k))
    pristine = Pristine(inputs, 99)
    assert clones == [], "lean inputs are never copied"
    assert all(isinstance(f, tuple) for _, f in pristine.kept)
    Pristine(inputs, None)
    assert len(clones) == 3, "without LEAN_INPUTS every input tensor is copied"
    raw = big.view(torch.int32)
    raw[-1] ^= 1  # the lowest bit of the last element, in the last chunk
    assert pristine.changed(inputs) == ["input 0"]
    raw[-1] ^= 1
    assert pristine.changed(inputs) == []
    # swapping two chunks keeps every chunk's sum: the chunk factors catch it
    a = torch.arange(2 * calls.FINGERPRINT_CHUNK // 4, dtype=torch.int32)
    b = torch.cat([a[calls.FINGERPRINT_CHUNK // 4 :], a[: calls.FINGERPRINT_CHUNK // 4]])
    assert fingerprint(a, 5) != fingerprint(b, 5)
    assert fingerprint(a, 5) != fingerprint(a, 6), "the key matters"


def test_lean_inputs_are_declared_alone(tmp_path):
    from pkb_mcp import problems

    text = (problems.suite()[1].path).read_text()
    both = tmp_path / "001_allreduce.py"
    both.write_text(text + "\nMUTATES_INPUTS = True\nLEAN_INPUTS = True\n")
    with pytest.raises(problems.ProblemFormatError, match="LEAN_INPUTS cannot go with MUTATES_INPUTS"):
        problems.load_problem(both)
    both.write_text(text + "\nLEAN_INPUTS = 1\n")
    with pytest.raises(problems.ProblemFormatError, match="LEAN_INPUTS must be True or False"):
        problems.load_problem(both)
    both.write_text(text + "\nLEAN_INPUTS = True\n")
    assert problems.load_problem(both).lean_inputs


def record(events, host, waited=0):
    return {
        "device_ms": events,
        "wall_ms": events,
        "warmup_calls": 3,
        "stop_reason": "sample cap",
        "input_sets": 2,
        "clock": "cuda events",
        "host_clock_ms": host,
        "host_waited_calls": waited,
    }


def test_the_host_share_is_in_the_result_and_warned_of_when_the_events_miss_it():
    quiet, warnings = stats.summarize(record([1.0] * 10, [1.1] * 8))
    assert quiet.host_clock_median_ms == pytest.approx(1.1) and warnings == []
    synced, warnings = stats.summarize(record([1.0] * 10, [3.0] * 8, waited=10))
    assert synced.host_clock_median_ms == pytest.approx(3.0) and synced.host_waited_calls == 10
    assert (
        len(warnings) == 1 and "host's share" in warnings[0] and "10 of 10 timed calls waited" in warnings[0]
    )
    pooled = stats.pool_launches([record([1.0] * 4, [2.0] * 8, 1), record([1.0] * 4, [4.0] * 8, 2)])
    assert len(pooled["host_clock_ms"]) == 16 and pooled["host_waited_calls"] == 3
    older, _ = stats.summarize({k: v for k, v in record([1.0], []).items() if not k.startswith("host")})
    assert older.host_clock_median_ms is None and older.host_waited_calls == 0


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_draws_have_independent_real_and_imaginary_parts(dtype):
    from harness.context import DTYPES, ProblemContext

    assert DTYPES["complex128"] is torch.complex128
    ctx = ProblemContext(rank=0, world_size=2, size={}, seed=5)
    z = ctx.randn(4096, dtype=dtype, scale=2.0)
    assert z.dtype == dtype
    assert 1.8 < float(z.real.std()) < 2.2 and 1.8 < float(z.imag.std()) < 2.2
    assert abs(float(torch.corrcoef(torch.stack([z.real, z.imag]).double())[0, 1])) < 0.1
    u = ctx.rand(4096, low=1.0, high=3.0, dtype=dtype)
    assert float(u.imag.min()) >= 1.0 and float(u.imag.max()) < 3.0 and float(u.imag.std()) > 0.5
    assert not torch.equal(u.real, u.imag)
    shared = [
        ProblemContext(rank=r, world_size=2, size={}, seed=5).randn(8, dtype=dtype, shared=True)
        for r in (0, 1)
    ]
    assert torch.equal(shared[0], shared[1])
    meta = ProblemContext(rank=0, world_size=2, size={}, device=torch.device("meta"))
    assert meta.rand(3, 2, dtype=dtype).shape == (3, 2) and meta.randn(3, dtype=dtype).dtype == dtype


def sparse_inputs():
    torch.manual_seed(1)
    indices = torch.tensor([[0, 1, 1, 3], [2, 0, 2, 1]])
    return (torch.sparse_coo_tensor(indices, torch.randn(4), (4, 3)), [torch.randn(3)])


@pytest.mark.parametrize("lean", [False, True])
def test_sparse_inputs_are_snapshotted_and_their_changes_named(lean):
    inputs = sparse_inputs()
    names = [n for n, _ in input_tensors(inputs)]
    assert names == ["input 0 (sparse indices)", "input 0 (sparse values)", "input 1[0]"]
    pristine = Pristine(inputs, 4321 if lean else None)
    assert pristine.changed(inputs) == []
    inputs[0].mul_(2)
    assert pristine.changed(inputs) == ["input 0 (sparse values)"]
    inputs = sparse_inputs()
    pristine = Pristine(inputs, 4321 if lean else None)
    inputs[0]._indices()[1, 0] = 1  # the pattern moved, the values kept
    assert pristine.changed(inputs) == ["input 0 (sparse indices)"]


def test_a_sparse_input_is_copied_per_call_and_its_memory_watched():
    inputs = sparse_inputs()
    copy = calls.snapshot(inputs)[0]
    assert copy.layout == torch.sparse_coo and torch.equal(copy.to_dense(), inputs[0].to_dense())
    assert copy._values().data_ptr() != inputs[0]._values().data_ptr()
    assert aliased_inputs([inputs[0]._values()[1:], torch.zeros(2)], list(inputs)) == [0]
    assert aliased_inputs([inputs[0].to_dense()], list(inputs)) == []


def nested_inputs():
    torch.manual_seed(2)
    return ([torch.randn(3), torch.randn(2)], {"m": (torch.randn(2),)}, 4.0, torch.randn(2))


def test_a_working_copy_copies_the_tensors_inside_lists_tuples_and_dicts():
    inputs = nested_inputs()
    copy = calls.snapshot(inputs)
    assert isinstance(copy[0], list) and isinstance(copy[1]["m"], tuple) and copy[2] == 4.0
    pairs = zip(input_tensors(copy), input_tensors(inputs), strict=True)
    assert all(a.data_ptr() != b.data_ptr() and torch.equal(a, b) for (_, a), (_, b) in pairs)
    copy[0][1].add_(1)
    copy[0].append(torch.zeros(1))  # the list itself changed: the set's own list is another
    assert len(inputs[0]) == 2 and torch.equal(inputs[0][1], nested_inputs()[0][1])


def test_a_mutating_workload_has_every_tensor_its_inputs_hold_judged_after_the_call():
    from types import SimpleNamespace

    from harness.calls import Calls

    state = Calls.__new__(Calls)
    inputs = nested_inputs()
    state.mutates = False
    assert state.in_place([torch.ones(1)], inputs) == [torch.ones(1)]
    state.mutates = True
    judged = state.in_place([torch.ones(1)], inputs)
    assert [t.data_ptr() for t in judged[1:]] == [t.data_ptr() for _, t in input_tensors(inputs)]
    assert len(judged) == 5
    problem = SimpleNamespace(MUTATES_INPUTS=True)
    from harness import convention

    # an input inside a list, returned after its update in place, is the in-place result: allowed
    outs = [inputs[0][1], inputs[0][1][:1]]
    held = [t for _, t in input_tensors(inputs)]
    assert convention.aliasing_faults(problem, 0, 2, outs, held, [0, 1]) == [1]
