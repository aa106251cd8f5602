"""A client of the MCP tasks extension (io.modelcontextprotocol/tasks), as a client that declares it
behaves: a task handle from tools/call is resolved by polling tasks/get at the interval the server
asks for. What it saw is kept for the tests to read."""

from __future__ import annotations

from typing import Any, Literal

import anyio
import mcp.types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Result
from pydantic import TypeAdapter

EXTENSION_ID = "io.modelcontextprotocol/tasks"
ANY = TypeAdapter(dict[str, Any])


class TaskHandle(Result):
    """What tools/call returns in lieu of its result: the task, working."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    poll_interval_ms: int | None = None
    ttl_ms: int | None = None


async def get_task(session: Any, task_id: str) -> dict[str, Any]:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, ANY)


async def cancel_task(session: Any, task_id: str) -> dict[str, Any]:
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    return await session.send_request(request, ANY)


class Tasks(ClientExtension):
    identifier = EXTENSION_ID

    def __init__(self) -> None:
        self.handles: list[TaskHandle] = []
        self.polls: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
        self.handles.append(handle)
        with anyio.fail_after(600):
            while True:
                task = await get_task(ctx.session, handle.task_id)
                self.polls.append(task)
                if task["status"] != "working":
                    return CallToolResult.model_validate(task["result"])
                await anyio.sleep(task["pollIntervalMs"] / 1000)
