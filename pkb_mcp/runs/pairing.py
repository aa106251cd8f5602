"""A solution file's problem, from its file name: `NNN_slug.py` (ours) or the original benchmark's
`{id}_{name}_{backend}.py`.

The published solution sets were written against an older numbering of the original's references, so
their ids are often one off from ours while their names are right. So the name decides:

- the name is a problem's name: that problem; where the id in the name is another problem's (or none's),
  a note says so (the report shows it);
- the name is no problem's and the id is a problem's: that problem, with a warning (the name may be a
  problem of the original benchmark that this suite does not have);
- neither: an error, raised before anything runs.

Names are compared without regard to case (the original's `11_allgather_gemm_AT` is our
`011_allgather_gemm_at`). A name that matches only without its last word (the backend) decides where
the id is no problem's or one off from the named one; otherwise the last words may just describe the
file (`086_gather_once.py`, `024_no_allreduce.py`) and the id decides. The names are the catalogue's,
read from the files as text: only the problem paired is imported (importing the suite took a check 4.4 s
on a 2-core machine: docs/sandbox.md, "A check's start-up"). Imports pkb_mcp.catalogue, problems and
errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pkb_mcp import catalogue, problems
from pkb_mcp.errors import UserError

SOLUTION_NAME = re.compile(r"^(\d{1,3})_(\w+)\.py$", re.ASCII)


@dataclass(frozen=True)
class Pairing:
    """What a file's name says about its problem, and the problem it is run against."""

    problem: problems.Problem | None  # None: the name has no id (not a solution file's name)
    named_id: int | None = None  # the id written in the name
    backend: str | None = None  # the last word of an original-format name (cuda, triton, ...)
    note: str | None = None  # the id and the name disagree; the name won
    warning: str | None = None  # the name is no problem's; paired by the id

    @property
    def remark(self) -> str | None:
        return self.note or self.warning


def _by_name(words: str, suite: dict[int, catalogue.Entry]) -> catalogue.Entry | None:
    key = words.lower()
    return next((p for p in suite.values() if p.name == key), None)


def pair(path: str | Path) -> Pairing:
    """The problem a solution file is run against, decided by its name (module docstring). A name
    without a leading id pairs with nothing (`problem` None); an id and a name that are both unknown
    raise UserError."""
    file_name = Path(path).name
    m = SOLUTION_NAME.match(file_name)
    if m is None:
        return Pairing(problem=None)
    named_id, rest = int(m.group(1)), m.group(2)
    suite = catalogue.entries()
    # the whole rest first (ours: 011_allgather_gemm_at.py), then without a backend word
    # (11_allgather_gemm_AT_cuda.py); the first order keeps 011_allgather_gemm_at from pairing as 12
    named, backend = _by_name(rest, suite), None
    head, _, last = rest.rpartition("_")
    if named is None and head:
        named, backend = _by_name(head, suite), last
        # a name found only by dropping the last word is trusted where the id is none of ours or one
        # off from it (the published sets' renumbering); elsewhere the words describe the file
        # (086_gather_once.py is a file of problem 86, not problem 6 with a backend "once")
        if named is not None and named_id in suite and abs(named.id - named_id) > 1:
            named, head = None, ""  # the whole rest is the file's description
    if named is not None:
        note = None
        if named.id != named_id:
            by_id = suite.get(named_id)
            which = f"problem {named_id} ({by_id.name})" if by_id else f"id {named_id}, no problem here,"
            note = (
                f"{file_name} names problem {named.id} ({named.name}) but carries {which}: "
                f"run against {named.id}, by its name"
            )
        return Pairing(problem=problems.resolve(named.id), named_id=named_id, backend=backend, note=note)
    name, backend = (head, last) if head else (rest, None)
    if named_id in suite:
        by_id = suite[named_id]
        warning = (
            f"{file_name}: {name!r} is no problem's name; run against problem {named_id} "
            f"({by_id.name}) by its id: rename the file if that is not its problem"
        )
        return Pairing(
            problem=problems.resolve(by_id.id), named_id=named_id, backend=backend, warning=warning
        )
    raise UserError(
        f"{file_name}: neither its id {named_id} nor its name {rest!r} is a problem of this suite; "
        "name it {id}_{name}_{backend}.py after a problem of `pkb problems`"
    )


def for_request(ref: int | str, path: str | Path) -> tuple[int | str, str | None]:
    """The problem a check or benchmark of `path` runs against when asked for `ref`, and a note when that
    is not `ref`: a problem given by its id yields to the problem the file's name names (as in
    `pkb eval`); one given by its name is taken as given."""
    given = str(ref).strip()
    if not given.isdigit() or int(given) not in catalogue.entries():
        return ref, None  # a name is taken as given; an id of no problem is refused as asked for
    try:
        paired = pair(path)
    except UserError:
        return ref, None  # the name names nothing: the id given decides
    named = paired.problem
    if named is None or paired.warning is not None or named.id == int(given):
        return ref, None
    note = (
        f"problem {int(given)} was asked for, but the file's name {Path(path).name} names problem "
        f"{named.id} ({named.name}): run against {named.id}, by its name"
    )
    return named.id, note
