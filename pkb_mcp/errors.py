"""Errors a user can act on: one sentence that says what is wrong and how to fix it."""


class UserError(ValueError):
    """Bad input or environment (CLI exit code 2; an MCP tool error later)."""


class Cancelled(Exception):
    """The job was cancelled (by the client, cancel_job, or its time limit); nothing was judged."""


ECHO_CHARS = 64  # the most of a client's id or name that an error repeats (a 100 KB id comes back short)


def echoed(value: str) -> str:
    """A client's value as an error repeats it: whole up to ECHO_CHARS characters, else cut to that."""
    return value if len(value) <= ECHO_CHARS else value[: ECHO_CHARS - 3] + "..."
