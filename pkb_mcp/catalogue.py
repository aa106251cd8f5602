"""The suite's catalogue: what each problem is called and what it is (id, name, category, source,
summary, description, dtype, world-size rule), read from its file as text, without importing it.

A problem file imports torch, which takes seconds to import; `pkb problems` and the `list_problems`
tool need none of what it computes, so they read the catalogue. The words are the file's own top-level
literals before its first function (docs/problem-format.md); `problems.load_problem` reads them here
first, imports the file, refuses it where the imported words differ, and validates the rest. May
import `models`, `config` and `errors`; never torch or harness/.
"""

from __future__ import annotations

import ast
import contextlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, get_args

from pkb_mcp import config, python_text
from pkb_mcp.errors import UserError
from pkb_mcp.models import ProblemSummary, VariantName

FILE_PATTERN = re.compile(r"^(\d{3})_([a-z0-9_]+)\.py$")
VARIANTS: tuple[str, ...] = get_args(VariantName)
# where a problem file's body begins: its first top-level function, class or decorator. The words come
# before it (docs/problem-format.md), and only what precedes it is parsed: the body is most of a file,
# and parsing all of it took most of `pkb problems`' time
BODY = re.compile(rb"^(?:def |async def |class |@)", re.MULTILINE)
# the declarations the catalogue reads, and the type each must have
WORDS: dict[str, type] = {
    "ID": int,
    "NAME": str,
    "CATEGORY": str,
    "SOURCE": str,
    "SUMMARY": str,
    "DTYPE": str,
    "WORLD_SIZES": str,
}


class ProblemFormatError(ValueError):
    """A problem file breaks the format."""


@dataclass(frozen=True)
class Entry:
    """One problem of the catalogue: its file's words, nothing computed."""

    id: int
    name: str
    category: str
    source: str
    summary: str
    description: str
    dtype: str
    world_sizes: str
    path: Path


def _literals(path: Path, tree: ast.Module) -> dict[str, Any]:
    """The values of WORDS assigned at the top level of the file's head (the last assignment of each,
    as an import would leave it)."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in WORDS:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    raise ProblemFormatError(
                        f"{path.name}: {target.id} must be a literal (the catalogue reads it without "
                        "importing the file)"
                    ) from None
    return found


def _head(source: bytes, name: str) -> ast.Module:
    """The file's statements before its body; the whole file where that part does not parse alone (a
    docstring with a line that begins like a function)."""
    body = BODY.search(source)
    if body is not None:
        with contextlib.suppress(SyntaxError, ValueError):
            return python_text.parse(source[: body.start()], filename=name)
    return python_text.parse(source, filename=name)


def read_entry(path: Path) -> Entry:
    """One problem file's entry, or ProblemFormatError naming the file and what is wrong."""
    match = FILE_PATTERN.match(path.name)
    if not match:
        raise ProblemFormatError(f"{path.name}: problem files are named NNN_slug.py")
    try:
        tree = _head(path.read_bytes(), path.name)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ProblemFormatError(f"{path.name}: cannot be read ({type(exc).__name__}: {exc})") from exc
    words = _literals(path, tree)
    for name, kind in WORDS.items():
        if name not in words:
            raise ProblemFormatError(f"{path.name}: missing {name} (before the first function)")
        if not isinstance(words[name], kind):
            raise ProblemFormatError(f"{path.name}: {name} must be {kind}")
    if words["ID"] != int(match.group(1)) or words["NAME"] != match.group(2):
        raise ProblemFormatError(
            f"{path.name}: ID/NAME ({words['ID']}, {words['NAME']!r}) do not match the file name"
        )
    description = ast.get_docstring(tree) or ""
    if not description.strip():
        raise ProblemFormatError(
            f"{path.name}: needs a docstring saying what it computes and where it is from"
        )
    return Entry(
        id=words["ID"],
        name=words["NAME"],
        category=words["CATEGORY"],
        source=words["SOURCE"],
        summary=words["SUMMARY"],
        description=description,
        dtype=words["DTYPE"],
        world_sizes=words["WORLD_SIZES"],
        path=path.resolve(),
    )


def problem_files(directory: Path, variant: str) -> list[Path]:
    """A variant's problem files, in name order (files named `_*` are not problems)."""
    if not directory.is_dir():
        raise UserError(f"the problem suite {directory} does not exist; set PKB_PROBLEMS_DIR")
    folder = directory / "original" if variant == "original" else directory
    return [path for path in sorted(folder.glob("*.py")) if not path.name.startswith("_")]


@cache
def entries_in(directory: Path, variant: str) -> dict[int, Entry]:
    """A suite folder's problems of a variant by id, read as text: one file per id, and an original
    variant's file only for a problem of the suite of that name."""
    found: dict[int, Entry] = {}
    for path in problem_files(directory, variant):
        entry = read_entry(path)
        if entry.id in found:
            raise ProblemFormatError(f"{path.name}: id {entry.id} is also {found[entry.id].path.name}")
        found[entry.id] = entry
    if variant == "original":
        ours = entries_in(directory, "pkb")
        for pid, entry in found.items():
            if pid not in ours or ours[pid].name != entry.name:
                raise ProblemFormatError(f"original/{entry.path.name}: no problem {pid} of that name")
    return found


def entries(variant: str = "pkb") -> dict[int, Entry]:
    """The problems of a variant by id, read as text (the `original` variant: those that have its file)."""
    if variant not in VARIANTS:
        raise UserError(f"variant {variant!r} is not one of {', '.join(VARIANTS)}")
    return entries_in(config.problems_dir(), variant)


def summary(p: Entry) -> ProblemSummary:
    """A problem's row in `pkb problems` and list_problems."""
    return ProblemSummary(
        id=p.id,
        name=p.name,
        category=p.category,
        source=p.source,
        dtype=p.dtype,
        world_sizes=p.world_sizes,
        summary=p.summary,
    )


def list_problems(category: str | None = None, text: str | None = None) -> list[ProblemSummary]:
    """Problems in id order, filtered by category (exact, case-insensitive) and free text (in the
    name, summary, source, category or description)."""
    found = []
    for p in entries().values():
        if category and p.category.lower() != category.lower():
            continue
        haystack = " ".join([p.name, p.summary, p.source, p.category, p.description]).lower()
        if text and text.lower() not in haystack:
            continue
        found.append(summary(p))
    return found
