"""One scripted attempt of a real agent client against a stand-in model and pkb's real MCP server.

`claude(...)` and `codex(...)` write the client's configuration into a fresh home, start the client
headless in a session of its own (killed with everything it started at the wall limit), and return
what it printed. The stand-in (tests/agents/standin.py) is the model; pkb's server is
`python -m pkb_mcp serve --root WORKDIR`, with every variable it needs in its own `env` (Codex passes
none of its own environment to an MCP server).

Run as a module to record the transcripts kept as fixtures (tests/agents/transcripts/):

    PKB_CLAUDE=... PKB_CODEX=... python -m tests.agents.drive [--out DIR] [claude] [codex]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .standin import AnthropicStandIn, ResponsesStandIn, StandIn, Turn, attempt_script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRANSCRIPTS = HERE / "transcripts"
CODEX_MODEL = "gpt-5.5"  # a model Codex knows: its real tool set (apply_patch, tool_search)
WALL_S = 150.0


@dataclass
class Run:
    argv: list[str]
    rc: int | None  # None: killed at the wall limit
    wall_s: float
    stdout: str
    stderr: str

    def events(self) -> list[dict[str, Any]]:
        """The transcript's JSON lines (anything else it printed left out)."""
        out = []
        for line in self.stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out


def server_env(state: Path) -> dict[str, str]:
    """The environment pkb's server needs, given whole: PATH (docker, python), HOME, the temp dir,
    and every PKB_ setting of this process (a test's isolated directories), its state folder fresh."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PKB_") or k in ("PATH", "HOME", "TMPDIR")}
    env["PKB_STATE_DIR"] = str(state)
    return env


def server_command(work: Path, broken: bool = False) -> tuple[str, list[str]]:
    """pkb's server, or (broken) a command that exits at once, as a server that cannot start does."""
    if broken:
        return sys.executable, ["-c", "import sys; sys.exit('pkb: cannot start')"]
    return sys.executable, ["-m", "pkb_mcp", "serve", "--root", str(work)]


def launch(argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None, wall_s: float) -> Run:
    """The client in a session of its own; past `wall_s` its whole process group is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=wall_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return Run(argv, rc, round(time.monotonic() - t0, 2), out, err)


def claude(
    exe: str,
    standin: StandIn | None,
    work: Path,
    home: Path,
    prompt: str,
    broken_server: bool = False,
    wall_s: float = WALL_S,
) -> Run:
    """Claude Code headless: the prompt on stdin, stream-json out, pkb as its only MCP server.
    `standin` None: no model configured (no key), the preflight alone."""
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    command, args = server_command(work, broken_server)
    config = {"mcpServers": {"pkb": {"command": command, "args": args, "env": server_env(home / "state")}}}
    (home / "mcp.json").write_text(json.dumps(config, indent=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))}
    env.update(
        CLAUDE_CONFIG_DIR=str(home / "claude"),
        IS_SANDBOX="1",  # root: bypassPermissions is refused without it
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        ENABLE_TOOL_SEARCH="false",
        MCP_CONNECTION_NONBLOCKING="false",
        MCP_TIMEOUT="60000",
    )
    if standin is not None:
        env.update(ANTHROPIC_BASE_URL=standin.url, ANTHROPIC_API_KEY="test")
    argv = [
        exe,
        "--print",
        "--verbose",
        "--output-format",
        "stream-json",
        "--permission-mode",
        "bypassPermissions",
        "--mcp-config",
        str(home / "mcp.json"),
        "--strict-mcp-config",
    ]
    return launch(argv, work, env, prompt, wall_s)


def codex_config(
    url: str, work: Path, home: Path, model: str, broken_server: bool = False, required: bool = True
) -> str:
    """$CODEX_HOME/config.toml: the stand-in as a provider of its own (no key, no WebSocket, no
    retries), pkb's server required (waited for before the first turn, and `exec` fails when it
    cannot start; an optional server still starting after a short grace is left out of the turn),
    nothing sent anywhere but loopback."""
    command, args = server_command(work, broken_server)
    env = server_env(home / "state")
    return "\n".join(
        [
            f"model = {json.dumps(model)}",
            'model_provider = "standin"',
            "",
            "[model_providers.standin]",
            'name = "standin"',
            f"base_url = {json.dumps(url + '/v1')}",
            'wire_api = "responses"',
            "supports_websockets = false",
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
            "[mcp_servers.pkb]",
            f"command = {json.dumps(command)}",
            f"args = {json.dumps(args)}",
            f"required = {json.dumps(required)}",
            "startup_timeout_sec = 60",
            "",
            "[mcp_servers.pkb.env]",
            *(f"{k} = {json.dumps(v)}" for k, v in sorted(env.items())),
            "",
            "[analytics]",  # no metrics export (ab.chatgpt.com)
            "enabled = false",
            "",
            "[features]",  # no curated-plugin sync (github.com, chatgpt.com): loopback only
            "plugins = false",
            "",
        ]
    )


def codex(
    exe: str,
    standin: StandIn,
    work: Path,
    home: Path,
    task: str,
    model: str = CODEX_MODEL,
    broken_server: bool = False,
    required: bool = True,
    wall_s: float = WALL_S,
) -> Run:
    """Codex headless (`codex exec --json`), the task as its argument, stdin closed."""
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(codex_config(standin.url, work, home, model, broken_server, required))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env["CODEX_HOME"] = str(home)
    argv = [
        exe,
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--model",
        model,
        "--",
        task,
    ]
    return launch(argv, work, env, None, wall_s)


def task_text(problem: int, world_size: int) -> str:
    return (
        f"Solve pkb problem {problem} at world size {world_size}: read it with get_reference, write "
        f"solution.py in the working directory, check it with run_correctness (device cpu), then stop."
    )


CORRECT = (ROOT / "tests/candidates/original/001_allreduce_torch.py").read_text()
WRONG = (ROOT / "examples/wrong_allreduce_half.py").read_text()


def script(source: str) -> Sequence[Turn]:
    return attempt_script(1, source, world_size=2, device="cpu")


def record(clients: Sequence[str], base: Path, out: Path = TRANSCRIPTS) -> None:
    """Each fixture: the client's stdout as it came, written under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    task = task_text(1, 2)

    def save(name: str, run: Run, standin: StandIn | None) -> None:
        (out / name).write_text(run.stdout)
        posts = [(r.method, r.path) for r in standin.requests] if standin else []
        print(f"{name}: rc={run.rc} wall={run.wall_s}s lines={len(run.events())} requests={posts}")
        if standin is not None and standin.errors:
            print("  stand-in errors:", standin.errors)

    if "claude" in clients:
        exe = os.environ["PKB_CLAUDE"]
        for name, source in (("claude-pass.jsonl", CORRECT), ("claude-fail.jsonl", WRONG)):
            with AnthropicStandIn(script(source)) as standin:
                run = claude(exe, standin, base / name / "work", base / name / "home", task)
            save(name, run, standin)
        run = claude(exe, None, base / "nokey" / "work", base / "nokey" / "home", task)
        save("claude-no-key.jsonl", run, None)
        with AnthropicStandIn(script(CORRECT)) as standin:
            run = claude(
                exe, standin, base / "broken" / "work", base / "broken" / "home", task, broken_server=True
            )
        save("claude-mcp-failed.jsonl", run, standin)
    if "codex" in clients:
        exe = os.environ["PKB_CODEX"]
        for name, source in (("codex-pass.jsonl", CORRECT), ("codex-fail.jsonl", WRONG)):
            with ResponsesStandIn(script(source)) as standin:
                run = codex(exe, standin, base / name / "work", base / name / "home", task)
            save(name, run, standin)
        broken = base / "cbroken"
        with ResponsesStandIn(script(CORRECT)) as standin:
            run = codex(exe, standin, broken / "work", broken / "home", task, broken_server=True)
        save("codex-mcp-failed.jsonl", run, standin)  # required: nothing on stdout, exit 1
        (out / "codex-mcp-failed.stderr.txt").write_text(run.stderr)
        optional = base / "coptional"
        with ResponsesStandIn(script(CORRECT)) as standin:
            run = codex(
                exe, standin, optional / "work", optional / "home", task, broken_server=True, required=False
            )
        save("codex-mcp-failed-optional.jsonl", run, standin)  # the turn runs without pkb's tools


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="record the real clients' transcripts")
    parser.add_argument("clients", nargs="*", choices=["claude", "codex"], default=["claude", "codex"])
    parser.add_argument("--out", type=Path, default=TRANSCRIPTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pkb-agents-") as tmp:
        record(args.clients, Path(tmp), args.out)
