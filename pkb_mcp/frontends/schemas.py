"""The schemas tools/list publishes: each tool's input and output schema made portable and short.

Portable means every client can map them, by the MCP Inspector's `--strict` rules and the
function-calling dialects that clients turn tool schemas into (Gemini's OpenAPI subset, OpenAI's):

- no `type` array anywhere: every schema node has one `type`, or is an `anyOf` of branches that
  each have one;
- an argument has exactly one `type` and no `anyOf`: an optional argument (`T | None`) is published
  as `T`, left out of `required`, and the server still reads null or absence as its default; an
  argument of several types (`int | str`) as the one branch that can spell every value (`string`:
  the server reads digits as an id);
- a result's field that may be null is `anyOf [{type: T}, {type: null}]`: clients validate
  `structuredContent` against the output schema with JSON Schema validators, which must accept the
  null (a dialect without a null type, OpenAPI 3.0's `nullable`, has no spelling that also holds in
  JSON Schema, and no client maps output schemas onto one);
- no schema without a type (a field of `Any` declares what its values are: `WithJsonSchema`).

Short means tools/list stays below what every agent can carry (tests/test_schema_portability.py):
output schemas are published two objects deep (a tool's output and the result in it), without
`required` (a result holds every field of its model, but for list_problems' optional ones, absent
rather than null: the list would repeat the names); an object deeper than that (a rank, a side's
timing, the static report) is published as an object whose properties are not listed. The
result resource (`pkb://jobs/{id}/result`) holds all of it, and docs/measurement.md defines every
figure. Arguments are still validated against the tools' full models, and results are still the
full models, compacted: only what tools/list says is shorter.
"""

from __future__ import annotations

from typing import Any

# objects below this depth (0: the tool's output) are published without their properties
OUTPUT_DEPTH = 2
_NULL = {"type": "null"}
# the branch an argument of several scalar types is published as: the first of these it has (a
# string spells any of the others, an id as digits; the server reads it as before)
_WIDEST = ("string", "number", "integer", "boolean")


def published_input(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as published: without titles, each argument of one type."""
    out = {k: v for k, v in schema.items() if k != "title"}
    if "properties" in schema:
        out["properties"] = {name: one_type(prop) for name, prop in schema["properties"].items()}
    return out


def one_type(prop: dict[str, Any]) -> dict[str, Any]:
    """An argument's schema with one `type`: an `anyOf` of typed branches becomes the branch that
    is not null and, of several, the widest (every branch's values are still accepted: only the
    published schema narrows). Any other `anyOf` is left as it is, for the portability test to
    name."""
    out = {k: v for k, v in prop.items() if k != "title"}
    branches = out.get("anyOf")
    if not isinstance(branches, list) or not all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in branches
    ):
        return out
    values = [b for b in branches if b != _NULL]
    kinds = [b["type"] for b in values]
    scalars = set(kinds) <= set(_WIDEST) and all(set(b) == {"type"} for b in values)
    if not values or (len(values) > 1 and not scalars):
        return out
    chosen = values[0] if len(values) == 1 else {"type": next(k for k in _WIDEST if k in kinds)}
    del out["anyOf"]
    if out.get("default", 0) is None:
        del out["default"]
    return {**chosen, **out}


def published_output(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's output schema as published: its references resolved, no title or `required`,
    objects deeper than OUTPUT_DEPTH without their properties (the module's docstring says why)."""
    return _shallow(schema, schema.get("$defs", {}), 0)


def _shallow(node: dict[str, Any], defs: dict[str, Any], depth: int) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        beside = {k: v for k, v in node.items() if k != "$ref"}  # a field's description
        target = {k: v for k, v in defs[ref.removeprefix("#/$defs/")].items() if k != "description"}
        return _shallow({**target, **beside}, defs, depth)
    # `required` is left out: the module's docstring says why
    out = {k: v for k, v in node.items() if k not in ("$defs", "title", "required")}
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = [_shallow(b, defs, depth) for b in out["anyOf"]]
    if isinstance(out.get("items"), dict):
        out["items"] = _shallow(out["items"], defs, depth)  # a list's items are as deep as the list
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _shallow(out["additionalProperties"], defs, depth + 1)
    if "properties" in out:
        if depth >= OUTPUT_DEPTH:
            return {k: v for k, v in out.items() if k in ("type", "description")}
        out["properties"] = {k: _shallow(p, defs, depth + 1) for k, p in out["properties"].items()}
    return out
