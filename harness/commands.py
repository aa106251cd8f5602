"""Compiler commands written as shell lines (torch's build file, `nvcc -dryrun`), split into argv so that
they run without a shell.

A build runs what torch's build file and nvcc's plan say, and both write shell text: quoted words,
nvcc's variables (`"$CICC_PATH/cicc"`). Run through `/bin/sh -c`, a flag that carries a backtick or
`$(...)` would run a program of the candidate's choice, so every compile step is split here and run as
argv. `words` reads the plain part of the shell's language (blanks, single and double quotes,
backslashes, `$NAME` and `${NAME}` from a given table) and refuses everything else: a command
substitution, an operator (`;`, `&`, `|`, `<`, `>`, parentheses), a glob, a comment, an unknown
variable. A refused line is never run by a shell instead: its caller leaves the step to its own
fallback or fails it. Stdlib only: this runs inside the sandbox.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLANKS = " \t"
_REFUSED = set("`;&|<>()*?[\n\r")  # outside quotes: what a shell would treat as more than a word


class NotPlain(ValueError):
    """A command line that is more than words for the shell (module docstring); the message says why."""


def _variable(line: str, at: int, env: dict[str, str]) -> tuple[str, int]:
    """The value of the variable at `line[at]` (a `$`) and where the text after it starts."""
    if line.startswith("${", at):
        end = line.find("}", at + 2)
        name = line[at + 2 : end] if end >= 0 else ""
        after = end + 1
    else:
        found = _NAME.match(line, at + 1)
        name = found.group(0) if found else ""
        after = found.end() if found else at + 1
    if not _NAME.fullmatch(name):
        raise NotPlain(f"a $ that is not a plain variable at column {at} (command substitution?)")
    if name not in env:
        raise NotPlain(f"the variable ${name} is not known")
    return env[name], after


def words(line: str, env: dict[str, str] | None = None) -> list[str]:
    """The argv of one shell command line: its words as the shell would make them, variables taken
    from `env` (an unquoted one split at blanks). Raises NotPlain for anything else."""
    env = env or {}
    out: list[str] = []
    word: list[str] = []
    started = False  # a word has begun (an empty quoted string is a word)
    i = 0
    while i < len(line):
        c = line[i]
        if c in _BLANKS:
            if started:
                out.append("".join(word))
                word, started = [], False
            i += 1
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise NotPlain("an unclosed single quote")
            word.append(line[i + 1 : end])
            started, i = True, end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= len(line):
                    raise NotPlain("an unclosed double quote")
                c = line[i]
                if c == '"':
                    i += 1
                    break
                if c == "`":
                    raise NotPlain("a backtick (command substitution)")
                if c == "\\" and i + 1 < len(line) and line[i + 1] in '$`"\\':
                    word.append(line[i + 1])
                    i += 2
                elif c == "\\" and i + 1 < len(line) and line[i + 1] == "\n":
                    i += 2
                elif c == "$":
                    value, i = _variable(line, i, env)
                    word.append(value)
                else:
                    word.append(c)
                    i += 1
            started = True
        elif c == "\\":
            if i + 1 >= len(line) or line[i + 1] in "\n\r":
                raise NotPlain("a backslash at the end of a line")
            word.append(line[i + 1])
            started, i = True, i + 2
        elif c == "$":
            value, i = _variable(line, i, env)
            pieces = value.split()
            if not pieces:
                continue
            if value[:1] in _BLANKS and started:
                out.append("".join(word))
                word = []
            word.append(pieces[0])
            for piece in pieces[1:]:
                out.append("".join(word))
                word = [piece]
            started = True
            if value[-1:] in _BLANKS:
                out.append("".join(word))
                word, started = [], False
        elif c in _REFUSED or (c in "#~" and not started):
            raise NotPlain(f"{c!r} outside quotes: the line is more than one command's words")
        else:
            word.append(c)
            started, i = True, i + 1
    if started:
        out.append("".join(word))
    if not out:
        raise NotPlain("an empty command")
    return out
