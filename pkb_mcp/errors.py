"""Errors a user can act on: one sentence that says what is wrong and how to fix it."""


class UserError(ValueError):
    """Bad input or environment (CLI exit code 2; an MCP tool error later)."""


class Cancelled(Exception):
    """The job was cancelled (by the client, cancel_job, or its time limit); nothing was judged."""
