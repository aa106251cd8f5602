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
MAX_ITEMS = 256  # per tuple, list or dict
MAX_STR = 256
MAX_DIMS = 16
INT_LIMIT = 1 << 63
RETURNABLE = "tensors, None, bools, ints, floats, strings, torch.Size, and tuples, lists and dicts of them"

Structure = str | list  # "tensor", "tuple", or a tree node


class StructureError(ValueError):
    """A structure outside the grammar or the caps."""


def _dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


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
