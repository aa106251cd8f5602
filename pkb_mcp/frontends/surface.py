"""What the MCP server publishes about its tools besides their schemas: the order of tools/list, each
tool's behaviour hints (annotations) and how long a client may cache the list results.

The order is ours, the order an agent works in (pkb_mcp/frontends/server.py's INSTRUCTIONS), not the
order of registration; a tool left out of it comes last, by name, and the contract snapshot test fails
until it is placed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from mcp.server import CacheHint
from mcp.server.caching import CacheableMethod
from mcp_types import ToolAnnotations

TOOL_ORDER = (
    "list_problems",
    "get_reference",
    "compile_kernel",
    "run_correctness",
    "benchmark",
    "profile",
    "roofline",
    "job_status",
    "job_result",
    "cancel_job",
)

# Hints at their MCP defaults are left out (readOnlyHint and idempotentHint default to false, and
# destructiveHint and idempotentHint mean nothing for a read-only tool): tools/list stays short.
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
# a run adds a job and its records, and builds into the node's caches; it changes nothing it did not make
RUNS_CODE = ToolAnnotations(destructive_hint=False, open_world_hint=False)
# cancelling ends the job's processes for good; cancelling it again changes nothing more
CANCELS = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)

HOUR_MS = 3_600_000
# The lists are fixed for the life of a server process (nothing is added at run time, so no
# list_changed): the same for every client, stale only once the server is upgraded. A resource read
# succeeds only for what no longer changes (a reference, a finished job's result, trace or timeline),
# but a job's are its submitter's: private.
CACHE_HINTS: dict[CacheableMethod, CacheHint] = {
    "tools/list": CacheHint(ttl_ms=HOUR_MS, scope="public"),
    "prompts/list": CacheHint(ttl_ms=HOUR_MS, scope="public"),
    "resources/list": CacheHint(ttl_ms=HOUR_MS, scope="public"),
    "resources/templates/list": CacheHint(ttl_ms=HOUR_MS, scope="public"),
    "server/discover": CacheHint(ttl_ms=HOUR_MS, scope="public"),
    "resources/read": CacheHint(ttl_ms=HOUR_MS, scope="private"),
}


class _Named(Protocol):
    name: str


T = TypeVar("T", bound=_Named)


def ordered(tools: Iterable[T]) -> list[T]:
    """Tools in TOOL_ORDER; any other after them, by name."""
    rank = {name: i for i, name in enumerate(TOOL_ORDER)}
    return sorted(tools, key=lambda t: (rank.get(t.name, len(rank)), t.name))
