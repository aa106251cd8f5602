"""Loopback stand-ins for the model APIs of Claude Code, Codex and Gemini CLI, scripted turn by turn.

Each stand-in is a small HTTP server in a thread (`ThreadingHTTPServer` on 127.0.0.1, a free port):

- `AnthropicStandIn`: the Messages API Claude Code calls at `ANTHROPIC_BASE_URL`
  (`POST /v1/messages`, streamed as server-sent events or answered whole; `count_tokens` answered too).
- `ResponsesStandIn`: the OpenAI Responses API Codex calls at its provider's `base_url`
  (`POST /v1/responses`, server-sent events; its WebSocket upgrade is refused at once).
- `GeminiStandIn`: the Gemini API Gemini CLI calls at `GOOGLE_GEMINI_BASE_URL` with `GEMINI_API_KEY`
  set (`POST /v1beta/models/M:streamGenerateContent?alt=sse`; `:countTokens` answered too).

A script is a list of turns. A turn is a function of the request (a `Seen`: the parsed body, the
working directory the client told its model, the tool results so far) returning the model's next
action: a `Call` (a tool's name and arguments) or a `Say` (final text, which ends the attempt). Which
turn answers a request is counted from the conversation itself (the model's own turns already in it),
so a request the client retries gets the same answer again. A request with no tools (a side request
such as a title) and a request past the script's end get a short text answer.

Every request is recorded (`standin.requests`) for assertions, and each answer carries usage counted
from the bytes (about four characters a token) so the client's transcript shows tokens.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    """The model calls a tool."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Say:
    """The model answers with text and ends its turn."""

    text: str


Action = Call | Say


class Search(Call):
    """Codex's tool_search for a deferred tool, given by the stand-in itself (ResponsesStandIn.before)."""

    def __init__(self, query: str):
        super().__init__("tool_search", {"query": query, "limit": 20})


AUTO_SEARCH = "call_search_"  # the call id prefix of a Search: how a later request shows it was one


@dataclass
class Seen:
    """What a turn is given: the request as the client sent it, read into what a script needs."""

    body: dict[str, Any]
    turn: int  # the model's turns already in the conversation
    cwd: str | None  # the working directory the client named to its model
    tools: list[str]  # the tool names offered
    results: list[str]  # the tool results so far, oldest first, as text

    def tool(self, *suffixes: str) -> str:
        """The offered tool whose name is one of `suffixes` or ends in `__` + one of them."""
        for name in self.tools:
            if any(name == s or name.endswith("__" + s) for s in suffixes):
                return name
        raise LookupError(f"none of {suffixes} among the offered tools {self.tools}")


Turn = Callable[[Seen], Action]


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, the raw text where it was none, None where empty
    at: float = field(default_factory=time.time)


def tokens(value: Any) -> int:
    """A token count good enough for a transcript: about four characters a token."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return max(1, len(text) // 4)


def found_cwd(text: str) -> str | None:
    """The working directory a client's system text or environment context names."""
    for pattern in (
        r"<cwd>([^<\n]+)</cwd>",  # Codex's environment context
        r"[Pp]rimary working directory:\s*(\S[^\n]*)",  # Claude Code's environment section
        r"[Ww]orking directory:\s*(\S[^\n]*)",
        r"Workspace Directories:\**\s*\n\s*-\s*(\S[^\n]*)",  # Gemini CLI's session context
    ):
        match = re.search(pattern, text)
        if match:
            return match.group(1).strip()
    return None


def texts(value: Any) -> list[str]:
    """Every string inside a JSON value, depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in texts(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in texts(item)]
    return []


class StandIn:
    """A scripted model API on loopback; use as a context manager (`url`, `requests`)."""

    def __init__(self, script: Sequence[Turn], fallback: str = "Done."):
        self.script = list(script)
        self.fallback = fallback
        self.requests: list[Recorded] = []
        self.actions: list[tuple[int, Action]] = []  # each scripted answer given, with its turn
        self.errors: list[str] = []  # a turn that raised: its message (the client gets a 500)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def posts(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0] == path]

    # one per API
    def seen(self, body: dict[str, Any]) -> Seen:
        raise NotImplementedError

    def answer(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        raise NotImplementedError

    def next_action(self, body: dict[str, Any]) -> tuple[Seen, Action]:
        seen = self.seen(body)
        if not seen.tools or seen.turn >= len(self.script):
            return seen, Say(self.fallback)
        try:
            action = self.before(seen, self.script[seen.turn](seen))
        except Exception as exc:  # the client sees a server error; the test sees why
            self.errors.append(f"turn {seen.turn}: {type(exc).__name__}: {exc}")
            raise
        with self._lock:
            self.actions.append((seen.turn, action))
        return seen, action

    def before(self, seen: Seen, action: Action) -> Action:
        """The action given in place of the script's (a client's own preliminary step); as it is."""
        return action

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = raw.decode(errors="replace")
                with standin._lock:
                    standin.requests.append(Recorded(method, self.path, dict(self.headers.items()), body))
                try:
                    standin.answer(self, method, self.path, body)
                except Exception as exc:
                    send_json(self, 500, {"error": {"type": "api_error", "message": str(exc)}})

            def do_GET(self) -> None:
                self._serve("GET")

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler


def send_json(handler: BaseHTTPRequestHandler, status: int, value: Any) -> None:
    data = json.dumps(value).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_events(handler: BaseHTTPRequestHandler, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Server-sent events, then the connection closed (no chunked framing to get wrong)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for name, data in events:
        handler.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()
    handler.close_connection = True


# --- Anthropic Messages (Claude Code) -----------------------------------------------------------


class AnthropicStandIn(StandIn):
    """`POST /v1/messages` (SSE when `stream` is true), `POST /v1/messages/count_tokens`, anything
    else a harmless empty JSON object."""

    model = "claude-standin"

    def seen(self, body: dict[str, Any]) -> Seen:
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        system = body.get("system")
        cwd = found_cwd(
            "\n".join(texts(system) + texts([m for m in messages if m.get("role") != "assistant"]))
        )
        results = []
        for m in messages:
            content = m.get("content")
            if m.get("role") == "user" and isinstance(content, list):
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        results.append("\n".join(texts(block.get("content"))))
        tools = [t.get("name", "") for t in body.get("tools") or []]
        return Seen(body, turn, cwd, tools, results)

    def answer(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        route = path.split("?")[0].rstrip("/")
        if method == "POST" and route.endswith("/messages/count_tokens"):
            send_json(handler, 200, {"input_tokens": tokens(body or "")})
            return
        if not (method == "POST" and route.endswith("/messages") and isinstance(body, dict)):
            send_json(handler, 200, {})
            return
        _, action = self.next_action(body)
        in_tokens = tokens({k: body.get(k) for k in ("system", "messages", "tools")})
        message_id = "msg_" + uuid.uuid4().hex[:24]
        if isinstance(action, Call):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": "toolu_" + uuid.uuid4().hex[:24],
                "name": action.name,
                "input": action.arguments,
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": action.text}
            stop = "end_turn"
        out_tokens = tokens(block)
        usage = {
            "input_tokens": in_tokens,
            "output_tokens": out_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or self.model,
            "stop_sequence": None,
        }
        if not body.get("stream"):
            send_json(handler, 200, {**message, "content": [block], "stop_reason": stop, "usage": usage})
            return
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            arguments = json.dumps(action.arguments if isinstance(action, Call) else {})
            half = len(arguments) // 2  # two deltas: the client must join them
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in (arguments[:half], arguments[half:])
            ]
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        **message,
                        "content": [],
                        "stop_reason": None,
                        "usage": {**usage, "output_tokens": 1},
                    },
                },
            ),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            *[
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
                for d in deltas
            ],
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": out_tokens},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        send_events(handler, events)


# --- OpenAI Responses (Codex) -------------------------------------------------------------------


class ResponsesStandIn(StandIn):
    """`POST /v1/responses` as server-sent events; a WebSocket upgrade (`GET` with `Upgrade`) and
    anything else answered 404 at once, so Codex streams over HTTP without waiting."""

    model = "gpt-standin"

    def seen(self, body: dict[str, Any]) -> Seen:
        items = body.get("input") or []
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        searches = {  # the stand-in's own tool_search calls: no turn of the script's
            item.get("call_id")
            for item in items
            if item.get("type") == "tool_search_call" and str(item.get("call_id")).startswith(AUTO_SEARCH)
        }
        calls = ("function_call", "custom_tool_call", "tool_search_call", "local_shell_call")
        turn = sum(
            1
            for item in items
            if (item.get("type") in calls and item.get("call_id") not in searches)
            or (item.get("type") == "message" and item.get("role") == "assistant")
        )
        cwd = found_cwd("\n".join(texts(body.get("instructions")) + texts(items)))
        results = [
            "\n".join(texts(item.get("output"))) or json.dumps(item.get("tools"))
            for item in items
            if item.get("type") in ("function_call_output", "custom_tool_call_output", "tool_search_output")
            and item.get("call_id") not in searches
        ]
        return Seen(body, turn, cwd, list(self.offered(body)), results)

    @staticmethod
    def offered(body: dict[str, Any]) -> dict[str, tuple[str, str | None, str]]:
        """The tools a request offers, by the name a script uses, each as (kind, namespace, name on the
        wire). Kinds: `function`; `custom` (a freeform tool such as `apply_patch`: its input is text,
        given as the argument `input`); `tool_search` (Codex's own search over deferred tools, run by
        the client, whose output then brings the tools it found). A namespace's functions (Codex puts
        each MCP server's tools in one, `mcp__pkb`) are named `<namespace>__<function>`, as Claude
        Code names MCP tools."""
        names: dict[str, tuple[str, str | None, str]] = {}
        found = [  # what a tool_search call loaded arrives in its output item, not in `tools`
            tool
            for item in body.get("input") or []
            if isinstance(item, dict) and item.get("type") == "tool_search_output"
            for tool in item.get("tools") or []
        ]
        for tool in [*(body.get("tools") or []), *found]:
            kind = tool.get("type")
            if kind == "namespace":
                for inner in tool.get("tools") or []:
                    names[f"{tool['name']}__{inner.get('name')}"] = (
                        "function",
                        tool["name"],
                        inner.get("name", ""),
                    )
            elif kind in ("function", "custom"):
                names[tool.get("name", "")] = (kind, None, tool.get("name", ""))
            elif kind == "tool_search":
                names["tool_search"] = ("tool_search", None, "tool_search")
        return names

    def before(self, seen: Seen, action: Action) -> Action:
        """A call of a tool Codex has deferred (MCP tools, for a model whose tools are searched) is
        preceded by a tool_search for it: a turn of the stand-in's own, not counted in the script, so
        one script serves a model that sees the tools up front and one that must search."""
        if isinstance(action, Call) and action.name not in seen.tools and "tool_search" in seen.tools:
            search = Search(action.name.rsplit("__", 1)[-1])
            searched = any(  # once: a search that found nothing leaves the call as it is
                item.get("type") == "tool_search_call" and item.get("arguments") == search.arguments
                for item in seen.body.get("input") or []
                if isinstance(item, dict)
            )
            return action if searched else search
        return action

    def answer(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        route = path.split("?")[0].rstrip("/")
        if not (method == "POST" and route.endswith("/responses") and isinstance(body, dict)):
            send_json(handler, 404, {"error": {"message": f"no {method} {route} here", "type": "not_found"}})
            return
        _, action = self.next_action(body)
        response_id = "resp_" + uuid.uuid4().hex[:24]
        if isinstance(action, Call):
            kind, namespace, name = self.offered(body).get(action.name, ("function", None, action.name))
            prefix = AUTO_SEARCH if isinstance(action, Search) else "call_"
            ids = {"id": "fc_" + uuid.uuid4().hex[:24], "call_id": prefix + uuid.uuid4().hex[:24]}
            item: dict[str, Any]
            if kind == "custom":
                item = {"type": "custom_tool_call", **ids, "name": name, "input": action.arguments["input"]}
            elif kind == "tool_search":
                item = {
                    "type": "tool_search_call",
                    **ids,
                    "execution": "client",
                    "arguments": action.arguments,
                }
            else:
                item = {
                    "type": "function_call",
                    **ids,
                    "name": name,
                    **({"namespace": namespace} if namespace else {}),
                    "arguments": json.dumps(action.arguments),
                }
            item["status"] = "completed"
        else:
            item = {
                "type": "message",
                "id": "msg_" + uuid.uuid4().hex[:24],
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": action.text, "annotations": []}],
            }
        in_tokens = tokens({k: body.get(k) for k in ("instructions", "input", "tools")})
        out_tokens = tokens(item)
        usage = {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        }
        base = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model") or self.model,
        }
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "response.created",
                {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}},
            ),
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": 0, "item": item},
            ),
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item},
            ),
            (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {**base, "status": "completed", "output": [item], "usage": usage},
                },
            ),
        ]
        for number, (_, data) in enumerate(events):
            data["sequence_number"] = number
        send_events(handler, events)


# --- Gemini API (Gemini CLI) --------------------------------------------------------------------


class GeminiStandIn(StandIn):
    """`POST .../models/M:streamGenerateContent` (server-sent `data:` chunks when `alt=sse`, else one
    JSON answer), `POST .../models/M:countTokens`, anything else a harmless empty JSON object."""

    model = "gemini-standin"

    def seen(self, body: dict[str, Any]) -> Seen:
        contents = body.get("contents") or []
        turn = sum(1 for c in contents if c.get("role") == "model")
        cwd = found_cwd("\n".join(texts([c for c in contents if c.get("role") != "model"])))
        results = [
            json.dumps(part["functionResponse"].get("response"))
            for c in contents
            for part in c.get("parts") or []
            if isinstance(part, dict) and "functionResponse" in part
        ]
        tools = [
            f.get("name", "") for t in body.get("tools") or [] for f in t.get("functionDeclarations") or []
        ]
        return Seen(body, turn, cwd, tools, results)

    def before(self, seen: Seen, action: Action) -> Action:
        """Gemini CLI names an MCP tool `mcp_<server>_<tool>`: a script's `mcp__pkb__run_correctness`
        is called by that name."""
        if isinstance(action, Call) and action.name.startswith("mcp__"):
            _, server, tool = action.name.split("__", 2)
            return Call(f"mcp_{server}_{tool}", action.arguments)
        return action

    def answer(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any) -> None:
        route = path.split("?")[0]
        if method == "POST" and route.endswith(":countTokens"):
            send_json(handler, 200, {"totalTokens": tokens(body or "")})
            return
        if not (method == "POST" and route.endswith("GenerateContent") and isinstance(body, dict)):
            send_json(handler, 200, {})
            return
        _, action = self.next_action(body)
        part: dict[str, Any] = (
            {"functionCall": {"name": action.name, "args": action.arguments}}
            if isinstance(action, Call)
            else {"text": action.text}
        )
        in_tokens = tokens({k: body.get(k) for k in ("systemInstruction", "contents", "tools")})
        usage = {"promptTokenCount": in_tokens, "candidatesTokenCount": tokens(part),
                 "totalTokenCount": in_tokens + tokens(part), "cachedContentTokenCount": 0}  # fmt: skip
        candidate = {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        chunk = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": self.model}
        if "alt=sse" not in path:
            send_json(handler, 200, chunk)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        handler.close_connection = True


# --- the ready script ---------------------------------------------------------------------------


def write_file(seen: Seen, path: str, content: str) -> Call:
    """The call that writes `content` to `path` with the file tool the client offers: Claude Code's
    `Write`; Gemini CLI's `write_file`; Codex's `apply_patch` (a freeform patch adding the file), else
    its `exec_command` (a shell here-document)."""
    if "Write" in seen.tools:
        return Call("Write", {"file_path": path, "content": content})
    if "write_file" in seen.tools:
        return Call("write_file", {"file_path": path, "content": content})
    text = content if content.endswith("\n") else content + "\n"
    if "apply_patch" in seen.tools:
        lines = "".join(f"+{line}\n" for line in text.splitlines())
        return Call(
            "apply_patch", {"input": f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"}
        )
    shell = seen.tool("exec_command", "shell")
    marker = "PKB_STANDIN_EOF"
    assert marker not in text
    command = f"cat > {json.dumps(path)} <<'{marker}'\n{text}{marker}\n"
    return Call(
        shell, {"cmd": command} if shell.endswith("exec_command") else {"command": ["bash", "-c", command]}
    )


def verdict(result: str) -> str | None:
    """The verdict in a run_correctness result as the model received it (pkb's structured content,
    in JSON, after whatever the client puts before it)."""
    match = re.search(r'"verdict"\s*:\s*"([a-z_]+)"', result)
    return match.group(1) if match else None


def attempt_script(
    problem: int | str | Callable[[Seen], int | str],
    source: str | Callable[[Seen], str],
    world_size: int = 2,
    device: str = "cpu",
    trials: int = 2,
    name: str = "solution.py",
    server: str = "pkb",
) -> list[Turn]:
    """One attempt, as a model would make it: read the problem (get_reference), write `name` with
    `source` into the working directory the client named, check it (run_correctness with the file's
    absolute path), then end with a sentence naming the verdict. `problem` and `source` may be
    functions of the request (an attempt told apart by its working directory). The script names an
    MCP tool `mcp__<server>__<tool>`, as Claude Code and Codex do (Codex's deferred ones are searched
    for first: ResponsesStandIn.before; Gemini CLI's names: GeminiStandIn.before)."""

    def of(value: Any, seen: Seen) -> Any:
        return value(seen) if callable(value) else value

    get_reference, run_correctness = (
        f"mcp__{server}__{tool}" for tool in ("get_reference", "run_correctness")
    )

    def where(seen: Seen) -> str:
        if not seen.cwd:
            raise LookupError("the request names no working directory")
        return f"{seen.cwd.rstrip('/')}/{name}"

    return [
        lambda s: Call(get_reference, {"problem": of(problem, s), "world_size": world_size}),
        lambda s: write_file(s, where(s), of(source, s)),
        lambda s: Call(
            run_correctness,
            {
                "problem": of(problem, s),
                "path": where(s),
                "world_size": world_size,
                "device": device,
                "trials": trials,
            },
        ),
        lambda s: Say(f"run_correctness verdict: {verdict(s.results[-1]) if s.results else None}"),
    ]
