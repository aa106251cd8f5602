"""One attempt of one problem by one agent, end to end (docs/agents.md, "One attempt"):

1. a fresh workspace holding TASK.md and nothing of the judge, and the client's own home;
2. pkb's MCP server written in the client's format: started by the client (stdio, its state folder
   the attempt's own) or, for a client in a container, started here on the host over HTTP with a
   token of the attempt's own; with `--tools cli`, no server and `pkb` on the client's PATH instead;
3. the client launched headless (pkb_mcp/agents/process.py or container.py), its stdout kept as it
   came (`transcript.jsonl`, the receipt times beside it in `transcript.times`), ended at the wall
   limit with everything it started;
4. the preflight: the client reports pkb's tools itself (Claude Code's init event), or pkb's server
   must have listed them before the agent's first tool call; else the attempt is `no_tools`;
5. `solution.py` collected from the workspace without trusting it (sandbox/untrusted.py), its
   snapshots read from the attempt's trail (pkb_mcp/agents/trail.py), the transcript read per client;
6. `attempt.json` written last: a folder without it is run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pkb_mcp import config, log, service
from pkb_mcp.agents import clients, trail
from pkb_mcp.agents.clients import Client, Server, Transcript
from pkb_mcp.agents.process import HostProcess, Launched
from pkb_mcp.agents.records import AgentSettings, AttemptRecord, AttemptStatus, Preflight
from pkb_mcp.agents.task import attempt_text

RECORD = "attempt.json"
SOLUTION = "solution.py"
SOLUTION_CAP = 1 << 20
POLL_S = 0.2
SERVER_START_S = 120.0
ORPHANS_WAIT_S = 20.0  # how long a killed server's watcher may take to remove its sandboxes
# the provider's variables a client in a container gets from the user's environment (the rest of it
# stays out: the server's token, other credentials)
PROVIDER_PREFIXES = (
    "ANTHROPIC_",
    "CLAUDE_",
    "OPENAI_",
    "CODEX_",
    "GEMINI_",
    "GOOGLE_",
    "CURSOR_",
    "AWS_",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)


@dataclass
class AttemptSpec:
    """What one attempt needs: its problem, its index, the run's settings and client, its folder."""

    problem_id: int
    problem: str
    attempt: int
    settings: AgentSettings
    client: Client
    executable: str
    folder: Path
    version: str | None = None
    pass_env: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def instruction(spec: AttemptSpec, workspace: Path) -> str:
    """TASK.md: the attempt_problem text, where to write the file, and how to reach pkb."""
    s = spec.settings
    detail = service.show_problem(spec.problem_id, s.world_size, s.size, s.variant)
    target = workspace / SOLUTION
    args = f"problem={spec.problem_id}, world_size={s.world_size}, size={s.size!r}, device={s.device!r}"
    if s.variant != "pkb":
        args += f", variant={s.variant!r}"
    if s.tools == "mcp":
        how = (
            f"Use pkb's MCP tools (run_correctness, benchmark, profile, roofline, get_reference) with {args} "
            f"and path={str(target)!r}."
        )
    else:
        opts = f"--world-size {s.world_size} --size {s.size} --device {s.device} --variant {s.variant}"
        how = (
            f"Use the `pkb` command in the shell: `pkb check {spec.problem_id} {target} {opts}`, then "
            f"`pkb bench {spec.problem_id} {target} {opts}` (`pkb --help` lists the rest)."
        )
    return "\n\n".join(
        [
            attempt_text(detail),
            f"Write your solution to {target} (that file is what is judged when you stop). {how}",
        ]
    )


class _Transcript:
    """The client's stdout, kept as it comes: each line appended to transcript.jsonl and its receipt
    time to transcript.times, by a thread of its own."""

    def __init__(self, folder: Path, stream: object):
        self.lines: list[bytes] = []
        self.times: list[float] = []
        self._out = (folder / "transcript.jsonl").open("ab")
        self._times = (folder / "transcript.times").open("a")
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            at = time.time()
            self._out.write(line)
            self._out.flush()
            self._times.write(f"{at:.3f}\n")
            self._times.flush()
            self.lines.append(line.rstrip(b"\n"))
            self.times.append(at)

    def close(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)
        self._out.close()
        self._times.close()


class _HttpServer:
    """pkb's MCP server on the host for a client in a container: streamable HTTP at the address
    containers reach, a token of the attempt's own, its state the attempt's, its log kept."""

    def __init__(self, env: dict[str, str], workspace: Path, log_path: Path, host: str):
        self.token = secrets.token_urlsafe(24)
        self.port = _free_port(host)
        self.url = f"http://{host}:{self.port}/mcp"
        self._log = log_path.open("wb")
        argv = [sys.executable, "-m", "pkb_mcp", "serve", "--transport", "http", "--host", host]
        argv += ["--port", str(self.port), "--root", str(workspace)]
        self.proc = subprocess.Popen(
            argv,
            env={**env, "PKB_TOKEN": self.token},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection((host, self.port), timeout=1):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"pkb's MCP server for the attempt did not start (its log: {log_path})")

    def stop(self) -> None:
        """SIGTERM, as a client ends it: it cancels its jobs and removes its sandboxes (docs/sandbox.md,
        leftovers)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _server_env(state: Path) -> dict[str, str]:
    """Every variable pkb's server needs, spelled out (Codex passes none of its own environment)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PKB_STATE_DIR": str(state),
        "PKB_CACHE_DIR": str(config.cache_dir()),
        trail.LISTED_ENV: str(state / "listed.json"),
    }
    for name, value in os.environ.items():
        if (name.startswith("PKB_") and name not in ("PKB_TOKEN", "PKB_STATE_DIR")) or name in (
            "DOCKER_HOST",
            "CUDA_VISIBLE_DEVICES",
            "PYTHONPATH",
            "TMPDIR",
        ):
            env.setdefault(name, value)
    return env


def _client_env(spec: AttemptSpec, home_env: dict[str, str], contained: bool) -> dict[str, str]:
    """The client's environment: the user's (as the user) or only its provider's variables (in a
    container), then its home's, then the attempt's own."""
    if contained:
        base = {k: v for k, v in os.environ.items() if k.startswith(PROVIDER_PREFIXES) or k in spec.pass_env}
        base["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    else:
        base = {k: v for k, v in os.environ.items() if k not in ("PKB_TOKEN",)}
    base.setdefault("HOME", home_env.get("HOME", str(spec.folder / "home")))
    return {
        **base,
        **home_env,
        "PKB_PROBLEM": str(spec.problem_id),
        "PKB_ATTEMPT": str(spec.attempt),
        "PKB_INSTRUCTION": str(spec.folder / "workspace" / "TASK.md"),
    }


def _cli_path(folder: Path, state: Path) -> Path:
    """`--tools cli`: a `pkb` on the client's PATH that records each check and bench (trail.py)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "pkb"
    shim.write_text(
        "#!/bin/sh\n"
        f'PKB_STATE_DIR={state} {trail.CALLS_ENV}={state / "calls"} exec {sys.executable} -m pkb_mcp "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def _fresh(folder: Path) -> None:
    """An interrupted attempt's folder is kept aside (attempt-K.interrupted-N), never reused."""
    if folder.exists():
        n = 1
        while folder.with_name(f"{folder.name}.interrupted-{n}").exists():
            n += 1
        folder.rename(folder.with_name(f"{folder.name}.interrupted-{n}"))
    folder.mkdir(parents=True)


def run_attempt(spec: AttemptSpec) -> AttemptRecord:
    """Run one attempt to its record (written last, as `attempt.json`)."""
    s = spec.settings
    folder = spec.folder
    _fresh(folder)
    workspace, home, state = folder / "workspace", folder / "home", folder / "state"
    for d in (workspace, home, state):
        d.mkdir()
    task = instruction(spec, workspace)
    (workspace / "TASK.md").write_text(task)
    contained = s.agent_sandbox == "docker"
    started_iso, started = now_iso(), time.time()
    http: _HttpServer | None = None
    server: Server | None = None
    extra_path: Path | None = None
    log.get(__name__).info(
        "agents.attempt", problem=spec.problem_id, attempt=spec.attempt, folder=str(folder)
    )
    try:
        if s.tools == "mcp":
            env = _server_env(state)
            if contained:
                from pkb_mcp.agents import container

                http = _HttpServer(env, workspace, folder / "server.log", container.host_address())
                server = Server(url=http.url, token=http.token)
            else:
                argv = ["-m", "pkb_mcp", "serve", "--root", str(workspace)]
                server = Server(command=sys.executable, args=tuple(argv), env=env)
        else:
            extra_path = _cli_path(folder, state)
        home_env = spec.client.write_config(home, workspace, server)
        launch = spec.client.launch(spec.executable, home, s.model, task, s.max_turns, s.max_usd)
        env = _client_env(spec, home_env, contained)
        if extra_path is not None:
            env["PATH"] = f"{extra_path}{os.pathsep}{env['PATH']}"
        (folder / "command.txt").write_text(clients.describe(launch.argv) + "\n")
        proc = _start(spec, launch.argv, env, workspace, home, launch.stdin, contained)
        status, message, transcript, exit_code, preflight = _follow(spec, proc, folder, state, started)
        leftovers = proc.leftovers()
        spec.notes.extend(launch.notes)
    finally:
        if http is not None:
            http.stop()
    leftovers += _sandboxes_left()
    solution, digest = _collect(workspace, folder)
    if status == "done" and solution is None:
        status, message = "no_file", f"the agent ended without writing {SOLUTION}"
    times = _times(folder)
    tool_times = [times[i] for i in transcript.tool_lines if i < len(times)]
    snaps = trail.from_jobs(state, folder / "snapshots", started, tool_times)
    snaps += trail.from_calls(state / "calls", folder / "snapshots", started, tool_times)
    record = AttemptRecord(
        problem_id=spec.problem_id,
        problem=spec.problem,
        attempt=spec.attempt,
        agent=spec.client.name,
        agent_version=transcript.version or spec.version,
        model=transcript.model or s.model,
        tools=s.tools,
        agent_sandbox=s.agent_sandbox,
        status=status,
        message="; ".join(m for m in [message, *spec.notes] if m),
        started_at=started_iso,
        finished_at=now_iso(),
        wall_s=round(time.time() - started, 3),
        exit_code=exit_code,
        preflight=preflight,
        usage=transcript.usage,
        solution=solution,
        solution_sha256=digest,
        snapshots=snaps,
        leftovers=leftovers,
    )
    write_record(folder, record)
    return record


def _times(folder: Path) -> list[float]:
    try:
        return [float(x) for x in (trail.read(folder, "transcript.times", 1 << 26) or b"").split()]
    except ValueError:
        return []


def write_record(folder: Path, record: AttemptRecord) -> None:
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(record.model_dump_json(indent=2))
    os.replace(tmp, folder / RECORD)


def read_record(folder: Path) -> AttemptRecord | None:
    """A complete attempt's record, or None (absent or unreadable: the attempt runs again)."""
    data = trail.read(folder, RECORD, 1 << 24)
    try:
        return AttemptRecord.model_validate_json(data) if data is not None else None
    except ValueError:
        return None


def _start(
    spec: AttemptSpec,
    argv: list[str],
    env: dict[str, str],
    workspace: Path,
    home: Path,
    stdin: bytes | None,
    contained: bool,
) -> Launched:
    marker = f"{spec.problem_id}-{spec.attempt}-{secrets.token_hex(4)}"
    if not contained:
        return HostProcess(argv, env, workspace, spec.folder / "stderr.log", stdin, marker)
    from pkb_mcp.agents import container

    mounts = [
        container.Mount(workspace, str(workspace), writable=True),
        container.Mount(home, str(home), writable=True),
        *container.client_mounts(Path(spec.executable)),
    ]
    return container.launch(
        argv,
        env=env,
        cwd=workspace,
        mounts=mounts,
        stderr=spec.folder / "stderr.log",
        stdin=stdin,
        name=f"pkb-agent-{marker}",
        labels={"pkb.problem": str(spec.problem_id), "pkb.attempt": str(spec.attempt)},
    )


def _follow(
    spec: AttemptSpec, proc: Launched, folder: Path, state: Path, started: float
) -> tuple[AttemptStatus, str, Transcript, int | None, Preflight]:
    """Wait for the client up to the wall limit, checking the preflight as its transcript comes."""
    reader = _Transcript(folder, proc.stdout)
    deadline = started + spec.settings.wall_s
    status: AttemptStatus = "done"
    message = ""
    preflight: Preflight | None = None
    transcript = Transcript()
    checked = 0
    try:
        while proc.poll() is None:
            if time.time() > deadline:
                status, message = "agent_timeout", f"killed at the wall limit of {spec.settings.wall_s:g} s"
                break
            if preflight is None and len(reader.lines) > checked:
                checked = len(reader.lines)
                transcript = spec.client.read(list(reader.lines))
                preflight = _preflight(spec, transcript, state, final=False)
                if preflight is not None and not preflight.ok:
                    status, message = "no_tools", preflight.message
                    break
            time.sleep(POLL_S)
    finally:
        proc.kill_all()
        reader.close()
    exit_code = proc.poll()
    transcript = spec.client.read(reader.lines)
    if preflight is None:
        preflight = _preflight(spec, transcript, state, final=True)
        assert preflight is not None
        if not preflight.ok and status == "done":
            status, message = "no_tools", preflight.message
    if status == "done" and transcript.error and not (spec.folder / "workspace" / SOLUTION).exists():
        status, message = "agent_error", transcript.error
    elif (
        status == "done"
        and exit_code not in (0, None)
        and not (spec.folder / "workspace" / SOLUTION).exists()
    ):
        status, message = "agent_error", f"the client exited with {exit_code} (its stderr: stderr.log)"
    return status, message, transcript, exit_code, preflight


def _preflight(spec: AttemptSpec, t: Transcript, state: Path, final: bool) -> Preflight | None:
    """Whether the client had pkb's tools; None while it cannot be told yet."""
    if spec.settings.tools == "cli":
        return Preflight(ok=True, how="--tools cli: pkb on the client's PATH")
    if t.preflight is not None:
        how = "the client's own report (its init event)"
        return Preflight(ok=t.preflight, how=how, tools=t.preflight_tools, message=t.preflight_message)
    if not spec.client.reports_preflight or final:
        tools = trail.listed(state / "listed.json")
        if tools:
            return Preflight(ok=True, how="pkb's server listed its tools to the client", tools=tools)
        if final or t.tool_lines:
            said = "pkb's server never listed its tools to the client"
            when = "" if final else " before the agent's first tool call"
            return Preflight(ok=False, how="pkb's server", message=said + when)
    return None


def _sandboxes_left() -> list[str]:
    """pkb sandboxes whose server is gone and that its watcher (sandbox/reaper.py) has not removed
    within ORPHANS_WAIT_S: a server killed before its cleanup, SIGKILL included, has its containers
    removed by its watcher a moment later; what is still there after that is removed, and named."""
    try:
        from sandbox.docker import connect, orphans, sweep
    except ImportError:
        return []
    try:
        client = connect()
        deadline = time.monotonic() + ORPHANS_WAIT_S
        while orphans(client) and time.monotonic() < deadline:
            time.sleep(0.5)
        removed = sweep(client)
    except Exception:  # no Docker engine: nothing of the kind to sweep
        return []
    return [f"{removed} pkb sandbox container(s) of the attempt's server, removed"] if removed else []


def _collect(workspace: Path, folder: Path) -> tuple[str | None, str | None]:
    """solution.py read without trusting the workspace (a link, a FIFO, a huge file are refused)."""
    from sandbox.untrusted import LaunchFiles

    files = LaunchFiles(workspace)
    data = files.read(SOLUTION, SOLUTION_CAP)
    if data is None:
        return None, None
    (folder / SOLUTION).write_bytes(data)
    return SOLUTION, hashlib.sha256(data).hexdigest()


def executable_version(exe: str) -> str | None:
    """`EXE --version`'s first line, where it answers within a few seconds."""
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0][:80] if first else None
