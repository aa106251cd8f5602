"""A loopback stand-in for the Anthropic Messages API, for driving the real Claude Code in tests: it
answers `POST /v1/messages` with the streamed events Claude Code reads, each turn scripted. A turn
is a function of the request (its JSON) returning a tool call `("tool", name, input)` or a final
`("text", words)`. The stand-in exists only in tests: users' runs talk to their provider."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = Callable[[dict[str, Any]], tuple[str, ...] | tuple[str, str, dict[str, Any]]]
WORKSPACE = re.compile(r"(/[^\s\"'`]*?/workspace)(?=[\s\"'`/.,]|$)")


def workspace_of(request: dict[str, Any]) -> str:
    """The working directory Claude Code tells the model of (in its system text)."""
    found = WORKSPACE.search(json.dumps(request.get("system", "")) + json.dumps(request.get("messages", [])))
    assert found, "the request names no workspace"
    return found.group(1)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class AnthropicStandin:
    """Serves `script` (one entry per assistant turn of the main conversation) on 127.0.0.1."""

    def __init__(self, script: list[Turn]):
        self.script = script
        self.requests: list[dict[str, Any]] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                standin.requests.append({"path": self.path, "body": body})
                if "count_tokens" in self.path:
                    self._json({"input_tokens": 100})
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"".join(standin.events(body)))

            def _json(self, data: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(data).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AnthropicStandin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self, body: dict[str, Any]) -> list[bytes]:
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        action = self.script[turn](body) if turn < len(self.script) else ("text", "done")
        usage = {"input_tokens": 1000, "output_tokens": 1, "cache_read_input_tokens": 200}
        head = {"id": f"msg_{turn}", "type": "message", "role": "assistant", "model": body.get("model", "m"),
                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
        out = [_sse("message_start", {"type": "message_start", "message": head})]
        if action[0] == "tool":
            _, name, given = action
            block = {"type": "tool_use", "id": f"toolu_{turn}", "name": name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(given)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": str(action[1])}
            stop = "end_turn"
        ended = {"stop_reason": stop, "stop_sequence": None}
        out += [
            _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _sse("message_delta", {"type": "message_delta", "delta": ended, "usage": {"output_tokens": 50}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]
        return out


def attempt_script(source_of_attempt: Callable[[dict[str, Any]], str], problem: str = "1") -> list[Turn]:
    """Write solution.py, run_correctness on it (CPU, 2 ranks), end."""

    def write(req: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        ws = workspace_of(req)
        return ("tool", "Write", {"file_path": f"{ws}/solution.py", "content": source_of_attempt(req)})

    def check(req: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        ws = workspace_of(req)
        args = {
            "problem": problem,
            "path": f"{ws}/solution.py",
            "world_size": 2,
            "device": "cpu",
            "trials": 1,
        }
        return ("tool", "mcp__pkb__run_correctness", args)

    return [write, check, lambda req: ("text", "done")]
