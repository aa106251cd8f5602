"""Outputs are taken plain at return, inside the call (harness/structure.py `plain`,
harness/calls.py `returning_plain`): nothing of the candidate's object runs once the call has
returned, so no work can be deferred to the harness's first touch after the clock stopped."""

import collections
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from harness import structure
from harness.calls import SolutionError, returning_plain


class Counting(torch.Tensor):
    """A tensor subclass that counts every torch call made on it (the lazy tensor's hook)."""

    touched = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Counting.touched += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class CountingTuple(tuple):
    iterated = 0

    def __iter__(self):
        CountingTuple.iterated += 1
        return super().__iter__()

    def __getitem__(self, i):
        CountingTuple.iterated += 1
        return super().__getitem__(i)

    def __len__(self):
        CountingTuple.iterated += 1
        return 0


class Impostor:
    """Claims to be a tensor through __class__ and answers every attribute lazily."""

    looked = 0

    @property
    def __class__(self):
        Impostor.looked += 1
        return torch.Tensor

    def __getattr__(self, name):
        Impostor.looked += 1
        return getattr(torch.ones(1), name)


def test_a_tensor_subclass_is_refused_without_being_touched():
    Counting.touched = 0
    lazy = torch.ones(3).as_subclass(Counting)
    Counting.touched = 0
    with pytest.raises(
        ValueError, match=r"^output 0 is a Counting, a subclass of torch.Tensor; return plain tensors$"
    ):
        structure.plain(lazy)
    with pytest.raises(ValueError, match=r"output 1\['b'\] is a Counting, a subclass"):
        structure.plain((torch.ones(1), {"a": 1, "b": lazy}))
    assert Counting.touched == 0, "not one torch call reached the subclass"
    with pytest.raises(ValueError, match=r"Parameter, a subclass of torch\.Tensor"):
        structure.plain(torch.nn.Parameter(torch.ones(2)))


def test_containers_are_read_through_their_base_types_and_rebuilt_plain():
    CountingTuple.iterated = 0
    t = torch.ones(2)
    out = structure.plain(CountingTuple((t, 3)))
    assert type(out) is tuple and out[0] is t and out[1] == 3
    assert CountingTuple.iterated == 0, "the subclass's own __iter__, __getitem__, __len__ never ran"
    named = collections.namedtuple("Named", "values indices")
    assert type(structure.plain(named(t, t))) is tuple
    top = structure.plain(torch.topk(torch.arange(5.0), 2))  # torch's own named tuple
    assert type(top) is tuple and torch.equal(top[0], torch.tensor([4.0, 3.0]))

    class Key(str):
        pass

    class Num(float):
        pass

    rebuilt = structure.plain({Key("k"): [Num(0.5), True, None, torch.Size([2])]})
    assert type(next(iter(rebuilt))) is str and type(rebuilt["k"][0]) is float
    assert rebuilt == {"k": [0.5, True, None, torch.Size([2])]}


def test_what_is_no_plain_value_is_refused_unread():
    Impostor.looked = 0
    with pytest.raises(ValueError, match="output 0 is a Impostor, which the harness cannot judge"):
        structure.plain([Impostor()])
    assert Impostor.looked == 0


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: torch.empty(4, device="meta"), "on the meta device"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "a nested tensor"),
        (lambda: torch._to_functional_tensor(torch.ones(2)), "functional or functorch wrapper"),
    ],
)
def test_tensors_that_are_no_plain_data_are_refused(make, words):
    with pytest.raises(ValueError, match=words):
        structure.plain((make(),))


def test_a_tensor_whose_methods_are_shadowed_by_attributes_is_refused():
    t = torch.ones(2)
    t.detach = lambda: torch.full((2,), 7.0)  # what the harness's copy at return would call
    with pytest.raises(ValueError, match=r"output 0 carries Python attributes \(detach\)"):
        structure.plain(t)


def test_sparse_coo_outputs_stay_allowed():
    s = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    assert structure.plain(s) is s


def test_the_check_runs_inside_the_call_and_names_the_output():
    lazy = torch.ones(2).as_subclass(Counting)
    call = returning_plain(lambda: (torch.ones(1), lazy))
    with pytest.raises(SolutionError, match=r"output 1 is a Counting, a subclass of torch\.Tensor"):
        call()
    assert returning_plain(lambda x: x + 1)(torch.ones(1)).item() == 2.0


def test_a_torch_mode_or_an_interpreter_hook_left_active_fails_the_call():
    class Deferred(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = Deferred()

    def leaves_a_mode():
        mode.__enter__()
        return torch.ones(1)

    try:
        with pytest.raises(SolutionError, match=r"left a torch function mode \(Deferred\) active"):
            returning_plain(leaves_a_mode)()
    finally:
        mode.__exit__(None, None, None)

    def leaves_a_hook():
        sys.setprofile(lambda *a: None)
        return torch.ones(1)

    try:
        with pytest.raises(SolutionError, match="a trace or profile hook"):
            returning_plain(leaves_a_hook)()
    finally:
        sys.setprofile(None)

    def default_device():  # torch's own mode, which honest code sets
        with torch.device("cpu"):
            return returning_plain(lambda: torch.ones(1))()

    assert default_device().shape == (1,)
