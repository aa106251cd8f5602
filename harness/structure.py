"""The structure of what a solution returns: a typed, bounded JSON encoding of its non-tensor parts,
written into the result file's header beside the tensors, and compared exactly on the host
(torch + stdlib only).

A single tensor is "tensor" and a tuple or list of tensors is "tuple" (the forms most problems
return). Anything else is a tree of nodes, each a JSON list whose first item is its kind:

  ["tensor"]                      a tensor: the next one of the file's tensors, in order
  ["none"]                        None
  ["bool", true]                  a bool
  ["int", 5]                      an int, |i| < 2**63
  ["float", "0x1.8p+0"]           a float, as float.hex (exact: NaN and infinities included)
  ["str", "text"]                 a string of at most MAX_STR characters
  ["size", [2, 3]]                a torch.Size
  ["sparse", [4, 6]]              a sparse COO tensor of that size, coalesced: the next two of the
                                  file's tensors, its indices (int64, [sparse dims, nnz]) and values
  ["tuple", [node, ...]]          a tuple or a list (one kind: either may be returned)
  ["dict", [["key", node], ...]]  a dict with string keys, sorted

The host reads a structure out of a file that candidate code could have written: `check` refuses
anything outside this grammar or over the caps (depth, items, string length) before it is used.
"""

from __future__ import annotations

from typing import Any

import torch

MAX_DEPTH = 8
MAX_NODES = 4096
MAX_ITEMS = 1024  # per tuple, list or dict: a problem's outputs may be as many (MAX_OUTPUTS)
MAX_STR = 256
MAX_DIMS = 16
INT_LIMIT = 1 << 63
RETURNABLE = "tensors, None, bools, ints, floats, strings, torch.Size, and tuples, lists and dicts of them"

Structure = str | list  # "tensor", "tuple", or a tree node


class StructureError(ValueError):
    """A structure outside the grammar or the caps."""


def _dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


# Plain outputs. What a solution returns is taken at return, inside the call (and so inside the
# timed region): `plain` rebuilds it from exactly the types below, reading containers through their
# base types' own slots and never through the object's attributes. Nothing the harness does with an
# output afterwards (encode, copies, comparisons, its release) can then run the candidate's code: a
# tensor subclass's __torch_function__, a container's __iter__, an object's __getattr__ or __del__
# would otherwise do deferred work at the harness's first touch, after the clock stopped.
_SCALARS = {type(None), bool, int, float, str}
# torch's own named tuples (torch.return_types: topk, sort, max along a dim ...)
_TORCH_TUPLES = {v for v in vars(torch.return_types).values() if isinstance(v, type) and issubclass(v, tuple)}
_is_functional = getattr(torch, "_is_functional_tensor", lambda t: False)
_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda t: False)


def type_name(cls: type) -> str:
    """A class's own name, read through `type` itself (a metaclass cannot redefine what it says)."""
    name = type.__dict__["__name__"].__get__(cls, type)
    return name if isinstance(name, str) else "?"


def _derives(cls: type, base: type) -> bool:
    """Whether `base` is in the class's real MRO (no __subclasscheck__ or __class__ consulted)."""
    return base in type.__dict__["__mro__"].__get__(cls, type)


def plain(out: Any) -> Any:
    """A solution's return rebuilt from plain values only: tuples, lists and dicts (subclasses read
    through tuple's, list's and dict's own slots, then rebuilt as those), None, bool, int, float,
    str (their subclasses converted), torch.Size, and tensors of exactly `torch.Tensor` that are
    dense or sparse COO, on the CPU or a GPU, with no Python attributes and no functional or functorch
    wrapper. ValueError naming the first part that is not: a tensor subclass ("output 0 is a
    LazyTensor, a subclass of torch.Tensor; return plain tensors") or anything else."""
    budget = [MAX_NODES]
    if type(out) is torch.Tensor or _derives(type(out), torch.Tensor):
        return _plain(out, "output 0", 0, budget)
    return _plain(out, "the output", 0, budget)


def _plain(value: Any, where: str, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"the output holds more than {MAX_NODES} parts")
    if depth > MAX_DEPTH:
        raise ValueError(f"{where} is nested deeper than {MAX_DEPTH} levels")
    cls = type(value)
    if cls is torch.Tensor:
        _check_plain_tensor(value, where)
        return value
    if cls in _SCALARS:
        return value
    if cls is torch.Size:
        return value
    if _derives(cls, torch.Tensor):
        raise ValueError(f"{where} is a {type_name(cls)}, a subclass of torch.Tensor; return plain tensors")
    if _derives(cls, torch.Size):
        return torch.Size(tuple.__getitem__(value, i) for i in range(tuple.__len__(value)))
    if cls is tuple or cls in _TORCH_TUPLES or _derives(cls, tuple):
        n = tuple.__len__(value)
        return tuple(
            _plain(tuple.__getitem__(value, i), _child(where, str(i)), depth + 1, budget) for i in range(n)
        )
    if cls is list or _derives(cls, list):
        items = list.copy(value)
        return [_plain(v, _child(where, str(i)), depth + 1, budget) for i, v in enumerate(items)]
    if cls is dict or _derives(cls, dict):
        pairs = list(dict.items(value))
        if not all(type(k) is str or _derives(type(k), str) for k, _ in pairs):
            raise ValueError(f"{where} is a dict whose keys are not all strings")
        return {
            str.__str__(k): _plain(v, _child(where, repr(str.__str__(k))), depth + 1, budget)
            for k, v in pairs
        }
    if _derives(cls, int):  # an IntEnum, say (bool has no subclasses)
        return int.__index__(value)
    if _derives(cls, float):  # a NumPy float64, say
        return float.__float__(value)
    if _derives(cls, str):
        return str.__str__(value)
    raise ValueError(f"{where} is a {type_name(cls)}, which the harness cannot judge: return {RETURNABLE}")


def _check_plain_tensor(t: torch.Tensor, where: str) -> None:
    """A tensor of exactly torch.Tensor that is plain data: ValueError otherwise. Its attributes are
    read from the class (data descriptors of torch's own), so nothing of the candidate's runs."""
    if t.__dict__:
        names = ", ".join(sorted(str(k)[:40] for k in list(t.__dict__)[:4]))
        raise ValueError(f"{where} carries Python attributes ({names}); return plain tensors")
    if t.is_nested:
        raise ValueError(f"{where} is a nested tensor; return plain tensors")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{where} is a tensor on the {t.device.type} device; return plain tensors")
    if _is_functional(t) or _is_wrapped(t):
        raise ValueError(f"{where} is a functional or functorch wrapper tensor; return plain tensors")


def encode(out: Any) -> tuple[Structure, list[torch.Tensor]]:
    """(structure, tensors in order) of a solution's return; ValueError for what cannot be judged."""
    if _dense(out):
        return "tensor", [out]
    sequence = isinstance(out, (tuple, list)) and not isinstance(out, torch.Size)
    if sequence and all(_dense(t) for t in out):
        return "tuple", list(out)
    tensors: list[torch.Tensor] = []
    tree = _node(out, tensors, "the output", 0)
    check(tree)
    return tree, tensors


def _node(value: Any, tensors: list[torch.Tensor], where: str, depth: int) -> list:
    if depth > MAX_DEPTH:
        raise ValueError(f"{where} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, torch.Tensor):
        if value.layout == torch.sparse_coo:
            # coalesced: sorted, unique indices, so that equal sparse tensors have equal parts
            value = value.coalesce()
            tensors.extend([value._indices(), value._values()])
            return ["sparse", [int(d) for d in value.shape]]
        if value.layout != torch.strided:
            raise ValueError(f"{where} is a {value.layout} tensor: return a dense or a sparse COO tensor")
        tensors.append(value)
        return ["tensor"]
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        if not -INT_LIMIT < value < INT_LIMIT:
            raise ValueError(f"{where} is an int outside 64 bits")
        return ["int", int(value)]
    if isinstance(value, float):
        return ["float", float(value).hex()]
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise ValueError(f"{where} is a string longer than {MAX_STR} characters")
        return ["str", value]
    if isinstance(value, torch.Size):
        return ["size", [int(d) for d in value]]
    if isinstance(value, (tuple, list)):
        return ["tuple", [_node(v, tensors, _child(where, str(i)), depth + 1) for i, v in enumerate(value)]]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{where} is a dict whose keys are not all strings")
        return [
            "dict",
            [[k, _node(value[k], tensors, _child(where, repr(k)), depth + 1)] for k in sorted(value)],
        ]
    raise ValueError(
        f"{where} is a {type(value).__name__}, which the harness cannot judge: return {RETURNABLE}"
    )


def extended(structure: Structure, tensors: int, more: int) -> Structure:
    """A structure of `tensors` tensors with `more` tensors after them (a mutating workload's
    in-place outputs, judged after its returned ones): further items of the outermost tuple, which a
    single tensor or a return of another kind becomes the first item of."""
    if not more:
        return structure
    if structure in ("tensor", "tuple"):
        return "tuple"
    node = tree(structure, tensors)
    items = node[1] if node[0] == "tuple" else [node]
    return ["tuple", [*items, *(["tensor"] for _ in range(more))]]


def decode(structure: Structure, tensors: list[torch.Tensor]) -> Any:
    """The value `encode` read `structure` and `tensors` from, rebuilt (tuples and lists both come
    back as tuples; the inverse of `encode` otherwise)."""
    if structure == "tensor":
        return tensors[0]
    if structure == "tuple":
        return tuple(tensors)
    assert isinstance(structure, list)
    left = iter(tensors)

    def build(node: list) -> Any:
        kind = node[0]
        if kind == "tensor":
            return next(left)
        if kind == "none":
            return None
        if kind == "float":
            return float.fromhex(node[1])
        if kind == "size":
            return torch.Size(node[1])
        if kind == "sparse":
            indices, values = next(left), next(left)
            return torch.sparse_coo_tensor(indices, values, node[1], is_coalesced=True)
        if kind == "tuple":
            return tuple(build(item) for item in node[1])
        if kind == "dict":
            return {k: build(item) for k, item in node[1]}
        return node[1]  # bool, int, str

    return build(structure)


def _child(where: str, label: str) -> str:
    return f"output {label}" if where == "the output" else f"{where}[{label}]"


def check(structure: object) -> int:
    """The number of tensors a structure read from a result file holds; StructureError for one
    outside the grammar or the caps."""
    if structure == "tensor":
        return 1
    if structure == "tuple":
        raise StructureError("a 'tuple' structure's length comes from its tensors")
    count = [0, 0]  # nodes, tensors
    _check(structure, 0, count)
    return count[1]


def _check(node: object, depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH + 1:
        raise StructureError("the structure is too large or too deep")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise StructureError("a structure node must be a list starting with its kind")
    kind, args = node[0], node[1:]
    if kind in ("tensor", "none") and not args:
        count[1] += kind == "tensor"
        return
    if len(args) != 1:
        raise StructureError(f"a {kind!r} node has the wrong number of items")
    value = args[0]
    if kind == "bool" and isinstance(value, bool):
        return
    if kind == "int" and type(value) is int and -INT_LIMIT < value < INT_LIMIT:
        return
    if kind == "float" and isinstance(value, str) and len(value) <= 32:
        try:
            float.fromhex(value)
        except ValueError as exc:
            raise StructureError("a float node is not a float's hex form") from exc
        return
    if kind == "str" and isinstance(value, str) and len(value) <= MAX_STR:
        return
    dims = kind in ("size", "sparse") and isinstance(value, list) and len(value) <= MAX_DIMS
    if dims and all(type(d) is int and 0 <= d < INT_LIMIT for d in value):  # type: ignore[union-attr]
        count[1] += 2 * (kind == "sparse")  # its indices and values
        return
    if kind == "tuple" and isinstance(value, list) and len(value) <= MAX_ITEMS:
        for item in value:
            _check(item, depth + 1, count)
        return
    if kind == "dict" and isinstance(value, list) and len(value) <= MAX_ITEMS:
        keys = []
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise StructureError("a dict node's items must be [key, node] pairs")
            if len(pair[0]) > MAX_STR:
                raise StructureError("a dict key is too long")
            keys.append(pair[0])
            _check(pair[1], depth + 1, count)
        if keys != sorted(set(keys)):
            raise StructureError("a dict node's keys must be unique and sorted")
        return
    raise StructureError(f"a {kind!r} node is malformed")


def tree(structure: Structure, tensors: int) -> list:
    """The tree form of any structure ("tensor" and "tuple" expanded, with `tensors` tensors)."""
    if structure == "tensor":
        return ["tensor"]
    if structure == "tuple":
        return ["tuple", [["tensor"] for _ in range(tensors)]]
    assert isinstance(structure, list)
    return structure


def difference(got: list, want: list, where: str = "the output") -> str | None:
    """Where two trees first differ, as "output 2: expected None, got tensor"; None when they are
    the same (tensor leaves are compared elsewhere: here only that both are tensors)."""
    if got[0] != want[0]:
        return f"{where}: expected {describe(want)}, got {describe(got)}"
    kind = want[0]
    if kind in ("tensor", "none"):
        return None
    if kind == "tuple":
        if len(got[1]) != len(want[1]):
            return f"{where}: expected {describe(want)}, got {describe(got)}"
        for i, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
            found = difference(g, w, _child(where, str(i)))
            if found:
                return found
        return None
    if kind == "dict":
        if [k for k, _ in got[1]] != [k for k, _ in want[1]]:
            return f"{where}: expected {describe(want)}, got {describe(got)}"
        for (k, g), (_, w) in zip(got[1], want[1], strict=True):
            found = difference(g, w, _child(where, repr(k)))
            if found:
                return found
        return None
    if got[1] != want[1] or type(got[1]) is not type(want[1]):
        return f"{where}: expected {describe(want)}, got {describe(got)}"
    return None


def tensor_names(node: list) -> list[str]:
    """Each tensor's place in a tree, in the tensors' order: "output 0", "output 2['values']"."""
    names: list[str] = []

    def walk(n: list, where: str) -> None:
        if n[0] == "tensor":
            names.append("output 0" if where == "the output" else where)
        elif n[0] == "sparse":
            at = "output 0" if where == "the output" else where
            names.extend([f"{at} (sparse indices)", f"{at} (sparse values)"])
        elif n[0] == "tuple":
            for i, item in enumerate(n[1]):
                walk(item, _child(where, str(i)))
        elif n[0] == "dict":
            for k, item in n[1]:
                walk(item, _child(where, repr(k)))

    walk(node, "the output")
    return names


def describe(node: list) -> str:
    """A node in words, for a message (bounded: strings and lists are cut short)."""
    kind = node[0]
    if kind == "tensor":
        return "tensor"
    if kind == "none":
        return "None"
    if kind == "float":
        return f"float {float.fromhex(node[1])!r}"
    if kind in ("bool", "int"):
        return f"{kind} {node[1]}"
    if kind == "str":
        text = node[1]
        return f"str {text[:40]!r}" + ("..." if len(text) > 40 else "")
    if kind == "size":
        return f"torch.Size({node[1][:MAX_DIMS]})"
    if kind == "sparse":
        return f"a sparse tensor of size {node[1][:MAX_DIMS]}"
    if kind == "tuple":
        return f"a tuple or list of {len(node[1])}"
    keys = ", ".join(repr(k[:40]) for k, _ in node[1][:6])
    return f"a dict with keys {keys}" + (", ..." if len(node[1]) > 6 else "") if node[1] else "an empty dict"
