"""The coding agents' clients, one record each: where its configuration home is, how pkb's MCP server
is written in its own format, its headless command, and how its transcript is read.

Facts each record rests on (verified headless: ../shared/agent-clients.md, docs/agents.md):
- Claude Code: `--print --verbose --output-format stream-json`, the prompt on stdin, MCP servers from
  `--mcp-config FILE --strict-mcp-config`; `CLAUDE_CONFIG_DIR` its home; its first line an `init`
  event naming each MCP server's status and the tools (the preflight); its last a `result` event.
- Codex: `codex exec --json`, the task as its last argument, stdin /dev/null; `CODEX_HOME/config.toml`
  with `[mcp_servers.pkb]`; it passes none of its environment to MCP servers; no turn limit.
- Gemini CLI: `--yolo --prompt TASK -o stream-json`; `$HOME/.gemini/settings.json`; MCP servers only
  in a trusted folder (`GEMINI_CLI_TRUST_WORKSPACE=true`).
- Cursor: `cursor-agent --print --output-format stream-json`; `$HOME/.cursor/mcp.json`.
- `cmd:TEMPLATE`: any other agent, started in the workspace by /bin/sh with `PKB_PROBLEM`,
  `PKB_ATTEMPT`, `PKB_MCP_CONFIG` (a `.mcp.json`-form file) and `PKB_INSTRUCTION` (the task file).

pkb's server is either started by the client (`stdio`: command, args, env) or already running on the
host for a client in a container (`http`: URL and bearer token).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_mcp.agents.records import Usage
from pkb_mcp.errors import UserError

PKB_TOOLS = (
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
RUN_TOOLS = ("run_correctness", "benchmark")
# how the clients name an MCP server's tool: Claude Code, Gemini CLI, Codex's namespace, others
PKB_TOOL_PREFIXES = ("mcp__pkb__", "mcp_pkb_", "pkb__", "pkb.", "pkb/")
MCP_TIMEOUT_MS = 120_000  # how long a client may take to connect pkb's server (it starts a sandbox pool)


@dataclass(frozen=True)
class Server:
    """pkb's MCP server as a client is told of it: stdio (`command`, `args`, `env`) or HTTP."""

    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    token: str | None = None

    def mcp_json(self) -> dict[str, Any]:
        """The `.mcp.json` form: {"mcpServers": {"pkb": ...}} (Claude Code's and cmd: agents')."""
        if self.url:
            entry: dict[str, Any] = {"type": "http", "url": self.url, "headers": self.headers()}
        else:
            entry = {"command": self.command, "args": list(self.args), "env": self.env}
        return {"mcpServers": {"pkb": entry}}

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@dataclass
class Launch:
    """What starts one attempt's client: its argv, stdin, environment additions and what was left
    out (budgets the client does not have)."""

    argv: list[str]
    stdin: bytes | None
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass
class Transcript:
    """What a transcript says, read per client. `tool_lines`: the transcript line of each tool call,
    in order (a snapshot's step is the count of calls before it)."""

    usage: Usage = field(default_factory=Usage)
    version: str | None = None
    model: str | None = None
    tool_lines: list[int] = field(default_factory=list)
    preflight: bool | None = None  # the client's own report of pkb's tools (Claude Code's init event)
    preflight_tools: list[str] = field(default_factory=list)
    preflight_message: str = ""
    error: str | None = None  # the client's own word that it failed


def is_pkb_tool(name: str) -> bool:
    """A tool name as a client shows it (`mcp__pkb__run_correctness`, `mcp_pkb_benchmark`, ...)."""
    for prefix in PKB_TOOL_PREFIXES:
        if name.startswith(prefix):
            return name.removeprefix(prefix) in PKB_TOOLS
    return name in PKB_TOOLS


def _events(lines: list[bytes]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for i, raw in enumerate(lines):
        try:
            event = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(event, dict):
            out.append((i, event))
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _add(a: int | None, b: Any) -> int | None:
    b = _int(b)
    return a if b is None else (a or 0) + b


# ---------------------------------------------------------------- Claude Code


def _claude_config(home: Path, workspace: Path, server: Server | None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "CLAUDE_CONFIG_DIR": str(home),
        "IS_SANDBOX": "1",  # as root, bypassPermissions needs it
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ENABLE_TOOL_SEARCH": "false",  # else MCP tools hide behind a search tool
        "MCP_CONNECTION_NONBLOCKING": "false",  # else it may start before pkb's tools are there
        "MCP_TIMEOUT": str(MCP_TIMEOUT_MS),
    }
    if server is not None:
        (home / "pkb-mcp.json").write_text(json.dumps(server.mcp_json(), indent=2))
    return env


def _claude_launch(
    exe: str, home: Path, model: str | None, task: str, max_turns: int | None, max_usd: float | None
) -> Launch:
    argv = [exe, "--print", "--verbose", "--output-format", "stream-json"]
    argv += ["--permission-mode", "bypassPermissions", "--strict-mcp-config"]
    if (home / "pkb-mcp.json").exists():
        argv += ["--mcp-config", str(home / "pkb-mcp.json")]
    if model:
        argv += ["--model", model]
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    if max_usd is not None:
        argv += ["--max-budget-usd", str(max_usd)]
    return Launch(argv, task.encode(), {})


def _claude_read(lines: list[bytes]) -> Transcript:
    t = Transcript()
    for i, e in _events(lines):
        kind = e.get("type")
        if kind == "system" and e.get("subtype") == "init":
            t.version = e.get("claude_code_version") or t.version
            t.model = e.get("model") or t.model
            servers = {
                s.get("name"): s.get("status") for s in e.get("mcp_servers") or [] if isinstance(s, dict)
            }
            tools = [n for n in e.get("tools") or [] if isinstance(n, str) and n.startswith("mcp__pkb__")]
            t.preflight_tools = [n.removeprefix("mcp__pkb__") for n in tools]
            t.preflight = servers.get("pkb") == "connected" and bool(tools)
            if not t.preflight:
                t.preflight_message = (
                    f"Claude Code's init: pkb {servers.get('pkb') or 'absent'}, {len(tools)} tools"
                )
        elif kind == "assistant":
            for block in (e.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    t.tool_lines.append(i)
                    t.usage.tool_calls += 1
                    t.usage.pkb_calls += is_pkb_tool(str(block.get("name", "")))
        elif kind == "result":
            usage = e.get("usage") or {}
            t.usage.turns = _int(e.get("num_turns"))
            t.usage.input_tokens = _add(
                _add(_int(usage.get("input_tokens")), usage.get("cache_creation_input_tokens")),
                usage.get("cache_read_input_tokens"),
            )
            t.usage.cached_tokens = _int(usage.get("cache_read_input_tokens"))
            t.usage.output_tokens = _int(usage.get("output_tokens"))
            cost = e.get("total_cost_usd")
            t.usage.cost_usd = float(cost) if isinstance(cost, int | float) else None
            if e.get("is_error"):
                t.error = str(e.get("result") or e.get("subtype") or "error")[:300]
    return t


# ---------------------------------------------------------------- Codex


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def _codex_config(home: Path, workspace: Path, server: Server | None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    lines = []
    if os.environ.get("OPENAI_BASE_URL"):  # a proxy's or gateway's: Codex reads it from its config
        lines.append(f"openai_base_url = {_toml_str(os.environ['OPENAI_BASE_URL'])}")
    if server is not None:
        lines.append("[mcp_servers.pkb]")
        if server.url:
            lines.append(f"url = {_toml_str(server.url)}")
            if server.token:
                lines.append(f"http_headers = {{ Authorization = {_toml_str('Bearer ' + server.token)} }}")
        else:
            lines.append(f"command = {_toml_str(server.command)}")
            lines.append("args = [" + ", ".join(_toml_str(a) for a in server.args) + "]")
            # Codex passes none of its own environment: every variable pkb needs is spelled out
            env = ", ".join(f"{k} = {_toml_str(v)}" for k, v in sorted(server.env.items()))
            lines.append(f"env = {{ {env} }}")
        lines.append("required = true")  # else Codex may start without pkb's tools and say nothing
        lines.append(f"startup_timeout_sec = {MCP_TIMEOUT_MS // 1000}")
        lines.append("tool_timeout_sec = 3600")
    existing = home / "config.toml"
    head = existing.read_text() + "\n" if existing.exists() else ""
    existing.write_text(head + "\n".join(lines) + "\n")
    return {"CODEX_HOME": str(home)}


def _codex_launch(
    exe: str, home: Path, model: str | None, task: str, max_turns: int | None, max_usd: float | None
) -> Launch:
    argv = [exe, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    if model:
        argv += ["--model", model]
    notes = _unsupported("codex", max_turns, max_usd)
    return Launch([*argv, "--", task], None, {}, notes)


CODEX_TOOL_ITEMS = ("command_execution", "mcp_tool_call", "web_search")


def _codex_read(lines: list[bytes]) -> Transcript:
    t = Transcript()
    for i, e in _events(lines):
        kind = e.get("type")
        item = _dict(e.get("item"))
        if kind == "item.started" and item.get("type") in CODEX_TOOL_ITEMS:
            t.tool_lines.append(i)
            t.usage.tool_calls += 1
            t.usage.pkb_calls += item.get("type") == "mcp_tool_call" and item.get("server") == "pkb"
        elif kind == "item.completed" and item.get("type") == "file_change":
            t.tool_lines.append(i)  # an edit has no started event
            t.usage.tool_calls += 1
        elif kind == "turn.completed":
            usage = e.get("usage") or {}
            t.usage.turns = (t.usage.turns or 0) + 1
            t.usage.input_tokens = _add(t.usage.input_tokens, usage.get("input_tokens"))
            t.usage.cached_tokens = _add(t.usage.cached_tokens, usage.get("cached_input_tokens"))
            t.usage.output_tokens = _add(t.usage.output_tokens, usage.get("output_tokens"))
        elif kind in ("turn.failed", "error"):
            err = _dict(e.get("error")) or e
            t.error = str(err.get("message") or kind)[:300]
    return t


# ---------------------------------------------------------------- Gemini CLI and Cursor


def _gemini_config(home: Path, workspace: Path, server: Server | None) -> dict[str, str]:
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {}
    if server is not None:
        entry: dict[str, Any] = (
            {"httpUrl": server.url, "headers": server.headers()}
            if server.url
            else {"command": server.command, "args": list(server.args), "env": server.env}
        )
        entry["timeout"] = MCP_TIMEOUT_MS
        entry["trust"] = True
        settings["mcpServers"] = {"pkb": entry}
    if os.environ.get("GEMINI_API_KEY"):
        # else GOOGLE_GEMINI_BASE_URL (a proxy's) makes Gemini CLI 0.61 pick its "gateway" auth, which it
        # then refuses headless ("Invalid auth method selected"); a fresh home has no choice of its own
        settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2))
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(workspace): "TRUST_FOLDER"}))
    return {"HOME": str(home), "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def _gemini_launch(
    exe: str, home: Path, model: str | None, task: str, max_turns: int | None, max_usd: float | None
) -> Launch:
    argv = [exe, "--yolo", "-o", "stream-json"]
    if model:
        argv.append(f"--model={model}")
    return Launch([*argv, f"--prompt={task}"], None, {}, _unsupported("gemini", max_turns, max_usd))


def _gemini_read(lines: list[bytes]) -> Transcript:
    t = Transcript()
    for i, e in _events(lines):
        kind = e.get("type")
        if kind == "init":
            t.model = e.get("model") or t.model
        elif kind == "tool_use":
            t.tool_lines.append(i)
            t.usage.tool_calls += 1
            t.usage.pkb_calls += is_pkb_tool(str(e.get("tool_name", "")))
        elif kind == "result":
            stats = e.get("stats") or {}
            t.usage.input_tokens = _int(stats.get("input_tokens"))
            t.usage.cached_tokens = _int(stats.get("cached"))
            t.usage.output_tokens = _int(stats.get("output_tokens"))
            if e.get("status") not in (None, "success"):
                t.error = str(e.get("error") or e.get("status"))[:300]
    return t


def _cursor_config(home: Path, workspace: Path, server: Server | None) -> dict[str, str]:
    (home / ".cursor").mkdir(parents=True, exist_ok=True)
    if server is not None:
        entry = (
            {"url": server.url, "headers": server.headers()}
            if server.url
            else server.mcp_json()["mcpServers"]["pkb"]
        )
        (home / ".cursor" / "mcp.json").write_text(json.dumps({"mcpServers": {"pkb": entry}}, indent=2))
    return {"HOME": str(home)}


def _cursor_launch(
    exe: str, home: Path, model: str | None, task: str, max_turns: int | None, max_usd: float | None
) -> Launch:
    argv = [exe, "--print", "--output-format=stream-json", "--force", "--approve-mcps"]
    if model:
        argv.append(f"--model={model}")
    return Launch([*argv, "--", task], None, {}, _unsupported("cursor", max_turns, max_usd))


def _cursor_read(lines: list[bytes]) -> Transcript:
    t = Transcript()
    for i, e in _events(lines):
        kind = e.get("type")
        if kind == "system" and e.get("subtype") == "init":
            t.model = e.get("model") or t.model
        elif kind == "tool_call" and e.get("subtype") == "started":
            t.tool_lines.append(i)
            t.usage.tool_calls += 1
            call = e.get("tool_call")
            call = call if isinstance(call, dict) else {}
            t.usage.pkb_calls += any("mcp" in str(k).lower() for k in call) and "pkb" in json.dumps(call)
        elif kind == "result" and e.get("is_error"):
            t.error = str(e.get("result") or "error")[:300]
    return t


def _unsupported(client: str, max_turns: int | None, max_usd: float | None) -> list[str]:
    notes = []
    if max_turns is not None:
        notes.append(f"{client} has no turn limit: --max-turns not applied (the wall limit is)")
    if max_usd is not None:
        notes.append(f"{client} has no spending limit: --max-usd not applied (the wall limit is)")
    return notes


# ---------------------------------------------------------------- cmd:TEMPLATE


def _cmd_config(home: Path, workspace: Path, server: Server | None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home)}
    if server is not None:
        (home / "mcp.json").write_text(json.dumps(server.mcp_json(), indent=2))
        env["PKB_MCP_CONFIG"] = str(home / "mcp.json")
    return env


def _cmd_read(lines: list[bytes]) -> Transcript:
    return Transcript()  # any agent's output: kept, not read


# ---------------------------------------------------------------- the table


ConfigWriter = Callable[[Path, Path, "Server | None"], dict[str, str]]
Launcher = Callable[[str, Path, "str | None", str, "int | None", "float | None"], Launch]


@dataclass(frozen=True)
class Client:
    name: str
    executable: str  # the command found on PATH, or the value of `env_var`
    env_var: str
    write_config: ConfigWriter
    launch: Launcher
    read: Callable[[list[bytes]], Transcript]
    has_turns: bool = False
    has_budget: bool = False
    reports_preflight: bool = False  # its transcript says whether pkb's tools were there at the start
    # the variables that sign it in: an attempt's home is fresh, so the client's own login is not there
    keys: tuple[str, ...] = ()

    def signed_in(self, environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
        """None, or a sentence saying the client will find no login (pkb carries none of its own
        logins into an attempt: concurrent attempts would share and rotate one refresh token)."""
        if not self.keys or any(environ.get(k) for k in self.keys):
            return None
        return (
            f"no {', '.join(self.keys[:-1])} or {self.keys[-1]} is set: {self.name}'s own login is not "
            "carried into an attempt's fresh home, so each attempt will fail to sign in"
        )


CLIENTS: dict[str, Client] = {
    "claude": Client(
        "claude", "claude", "PKB_CLAUDE", _claude_config, _claude_launch, _claude_read, True, True, True,
        ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
    ),
    "codex": Client(
        "codex", "codex", "PKB_CODEX", _codex_config, _codex_launch, _codex_read,
        keys=("OPENAI_API_KEY", "CODEX_API_KEY"),
    ),
    "gemini": Client(
        "gemini", "gemini", "PKB_GEMINI", _gemini_config, _gemini_launch, _gemini_read,
        keys=("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"),
    ),
    "cursor": Client(
        "cursor", "cursor-agent", "PKB_CURSOR", _cursor_config, _cursor_launch, _cursor_read,
        keys=("CURSOR_API_KEY",),
    ),
}  # fmt: skip


def cmd_client(template: str) -> Client:
    """`cmd:TEMPLATE`: the user's own command line, run by /bin/sh in the workspace."""
    if not template.strip():
        raise UserError("cmd: needs a command after it, e.g. cmd:'my-agent --task \"$PKB_INSTRUCTION\"'")

    def launch(
        exe: str, home: Path, model: str | None, task: str, max_turns: int | None, max_usd: float | None
    ) -> Launch:
        return Launch([exe, "-c", template], None, {}, _unsupported("a cmd: agent", max_turns, max_usd))

    return Client("cmd", "/bin/sh", "PKB_SH", _cmd_config, launch, _cmd_read)


def client(agent: str) -> Client:
    """The client `--agent` names, or one sentence naming those there are."""
    if agent.startswith("cmd:"):
        return cmd_client(agent.removeprefix("cmd:"))
    if agent not in CLIENTS:
        raise UserError(f"--agent {agent!r} is none of {', '.join(CLIENTS)} or cmd:TEMPLATE")
    return CLIENTS[agent]


def executable(c: Client) -> str:
    """The client's executable: `$PKB_<NAME>` where set, else found on PATH; one sentence if neither."""
    given = os.environ.get(c.env_var)
    found = given or shutil.which(c.executable)
    if not found or not (os.path.isfile(found) and os.access(found, os.X_OK)):
        where = f"${c.env_var} ({given}) is not an executable" if given else f"{c.executable} is not on PATH"
        raise UserError(f"--agent {c.name}: {where}; install it, or set {c.env_var} to its executable")
    return found


def describe(argv: list[str]) -> str:
    """A launch as a shell line, the task cut short (for the record and the logs)."""
    return " ".join(shlex.quote(a if len(a) < 120 else a[:60] + "...") for a in argv)


# ---------------------------------------------------------------- a user's own set-up (pkb doctor)

TOOL_TIMEOUT_S = 900  # a user's client waits this long for one call; longer benchmarks: wait=false
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


@dataclass(frozen=True)
class Setup:
    """How a user adds pkb's server to a client of theirs: where it goes, what to write or run, and
    the client's own check that it connects."""

    client: str
    where: str
    text: str
    check: str
    notes: tuple[str, ...] = ()


def setups(server: Server) -> list[Setup]:
    """Each client's set-up for `server` (stdio), in that client's own format. The server's `env`
    is spelled out for every client: Codex passes none of its own environment to MCP servers."""
    entry = {"command": server.command, "args": list(server.args), "env": server.env}
    claude = {"type": "stdio", **entry, "timeout": TOOL_TIMEOUT_S * 1000}
    codex = [
        "[mcp_servers.pkb]",
        f"command = {_toml_str(server.command)}",
        "args = [" + ", ".join(_toml_str(a) for a in server.args) + "]",
        f"startup_timeout_sec = {MCP_TIMEOUT_MS // 1000}",
        f"tool_timeout_sec = {TOOL_TIMEOUT_S}",
        "",
        "[mcp_servers.pkb.env]",
        *(f"{k} = {_toml_str(v)}" for k, v in sorted(server.env.items())),
    ]
    gemini = {"mcpServers": {"pkb": {**entry, "timeout": TOOL_TIMEOUT_S * 1000}}}
    line = " ".join(shlex.quote(a) for a in [server.command, *server.args])
    return [
        Setup(
            "Claude Code",
            "run once (user scope: a project's .mcp.json stays pending approval until `claude` is run "
            "interactively in it)",
            f"claude mcp add-json --scope user pkb {shlex.quote(json.dumps(claude))}",
            "claude mcp list   (pkb: ... - ✓ Connected)",
            (
                "`timeout` is Claude Code's limit for one tool call, in ms; `claude mcp add -e` sets the "
                "server's environment, not that limit",
            ),
        ),
        Setup(
            "Codex",
            "~/.codex/config.toml (or $CODEX_HOME/config.toml)",
            "\n".join(codex),
            "codex exec 'call the pkb tool list_problems'   (`codex mcp list` only reads the file)",
            ("Codex passes none of its environment to MCP servers: every variable pkb needs is in env",),
        ),
        Setup(
            "Gemini CLI",
            "~/.gemini/settings.json (its mcpServers key)",
            json.dumps(gemini, indent=2),
            "gemini mcp list   (in a trusted folder: pkb ... - Connected)",
            (
                "Gemini CLI disables every MCP server in a folder it does not trust: trust it once "
                "interactively, list it in ~/.gemini/trustedFolders.json, or set "
                "GEMINI_CLI_TRUST_WORKSPACE=true",
            ),
        ),
        Setup(
            "Cursor",
            "~/.cursor/mcp.json (or the project's .cursor/mcp.json)",
            json.dumps({"mcpServers": {"pkb": entry}}, indent=2),
            "cursor-agent mcp list",
        ),
        Setup(
            "MCP Inspector",
            "run (Node 22 or later: Inspector 2.12 declares it; on Debian's Node 20 a bare npx gets an "
            "old Inspector)",
            f"npx -y {INSPECTOR} --cli {line} --method tools/list --strict",
            "the same command: tools/list, and its schema portability report (no findings)",
        ),
    ]
