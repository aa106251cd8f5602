"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663): long tool calls as tasks.

A client that declares the extension in its capabilities gets a task handle, at once, from
`compile_kernel`, `run_correctness`, `benchmark` and `profile`, instead of a call that blocks for a
minute or more. A task is the scheduler's job under another name (its id is the job id), so it is
as durable as jobs are: it survives a server restart, and `job_status` / `job_result` answer for it
too. `tasks/get` reports where it stands (`working`, then `completed` with the tool's result, which
may be an error result, or `cancelled`), the job's latest progress message as its `statusMessage`,
a poll interval and a time to live; `tasks/cancel` cancels the job. A client that does not declare
the extension keeps the tools' `wait` argument and the job tools.

This layer only translates: the tools' own code submits the job (the interceptor asks it for
`wait=false`) and renders the result (`ServerState.result_of`).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Protocol

from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, CancelTaskRequestParams, GetTaskRequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from pkb_mcp.errors import UserError, echoed
from pkb_mcp.service import VERBS

if TYPE_CHECKING:
    from mcp.server.context import CallNext, ServerRequestContext
    from mcp_types import CallToolRequestParams

    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobRecord


class Jobs(Protocol):
    """What the extension needs of the server's tools (pkb_mcp/frontends/server.py `ServerState`)."""

    scheduler: Scheduler

    def result_of(self, record: JobRecord) -> CallToolResult: ...


EXTENSION_ID = "io.modelcontextprotocol/tasks"
TASK_TOOLS = frozenset(verb.tool for verb in VERBS.values())  # every tool that runs a job
POLL_INTERVAL_MS = 1000
TTL_MS = 7 * 24 * 3600 * 1000  # what the job store keeps is kept longer; this is the promise
INVALID_PARAMS = -32602
STATUS = {"queued": "working", "running": "working", "done": "completed", "failed": "completed"}


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client making this request declared the tasks extension, on a protocol version
    that can carry a task in lieu of a result (a legacy connection cannot: the result shape is core)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = getattr(capabilities, "extensions", None) if capabilities is not None else None
    return isinstance(extensions, dict) and EXTENSION_ID in extensions


class TasksExtension(Extension):
    identifier = EXTENSION_ID

    def __init__(self, state: Jobs) -> None:
        self.state = state  # the server's ServerState

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", GetTaskRequestParams, self._get),
            MethodBinding("tasks/cancel", CancelTaskRequestParams, self._cancel),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> Any:
        if params.name not in TASK_TOOLS or not declared(ctx):
            return await call_next(ctx)
        params.arguments = {**(params.arguments or {}), "wait": False}
        submitted = await call_next(ctx)
        structured = getattr(submitted, "structured_content", None)
        job_id = structured.get("job_id") if isinstance(structured, dict) else None
        if not isinstance(job_id, str):  # refused before any job (bad arguments): the tool's error as is
            return submitted
        return {"resultType": "task", **self.task(self.state.scheduler.get(job_id))}

    def task(self, record: JobRecord) -> dict[str, Any]:
        """The task of a job, as `tasks/get` and the call that created it report it."""
        status = STATUS.get(record.state, "cancelled")
        message = record.error if record.state in ("failed", "cancelled") else record.message
        task: dict[str, Any] = {
            "taskId": record.id,
            "status": status,
            "statusMessage": message or record.state,
            "createdAt": _iso(record.created),
            "lastUpdatedAt": _iso(record.finished or record.started or record.created),
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if status == "completed":
            result = self.state.result_of(record)
            task["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            finished = (result.structured_content or {}).get("result") or {}
            if isinstance(finished, dict) and isinstance(finished.get("message"), str):
                task["statusMessage"] = finished["message"]  # the verdict's headline
        return task

    def _record(self, task_id: str) -> JobRecord:
        try:
            return self.state.scheduler.get(task_id)
        except UserError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"task {echoed(task_id)} does not exist") from exc

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: GetTaskRequestParams) -> dict[str, Any]:
        return self.task(self._record(params.task_id))

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: CancelTaskRequestParams
    ) -> dict[str, Any]:
        record = self._record(params.task_id)  # an unknown task is refused there
        return self.task(self.state.scheduler.cancel(record.id, "cancelled by the client (tasks/cancel)"))
