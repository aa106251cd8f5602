"""`pkb doctor`: what this machine has for pkb, what dead processes left, and each client's set-up.

It looks at the Docker engine and the sandbox image, the GPUs, nvcc, the state folder and Node (for
the agent clients and the Inspector); it removes what pkb processes that are gone left behind (the
sandboxes of a server killed before its cleanup, an agent run's client containers: the same sweep
`pkb serve` and `pkb agents run` make at their start, never touching a live process's); and it
prints the set-up of pkb's server for Claude Code, Codex, Gemini CLI, Cursor and the Inspector on
this machine (pkb_mcp/agents/clients.py holds the formats). It starts no launch and imports no torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pkb_mcp import config
from pkb_mcp.agents.clients import Server, Setup, setups

Status = Literal["ok", "warn", "fail"]
# the variables a user's pkb server keeps from the environment it is set up in, where they are set
KEPT = ("PKB_CACHE_DIR", "PKB_SANDBOX_IMAGE", "PKB_NVCC", "PKB_ROOTS", "CUDA_VISIBLE_DEVICES", "DOCKER_HOST")
NODE_FOR_INSPECTOR = 22


@dataclass
class Finding:
    name: str
    status: Status
    detail: str


@dataclass
class Report:
    findings: list[Finding]
    removed: list[str]  # what processes that are gone left, removed now
    server: dict[str, Any]
    setups: list[Setup] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(f.status == "fail" for f in self.findings)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "failed": self.failed}


def user_server() -> Server:
    """pkb's server as a user's client starts it on this machine: this interpreter, and every
    variable it needs spelled out (the state folder, PATH for docker and nvcc, HOME)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(Path.home())),
        "PKB_STATE_DIR": str(config.state_path()),
    }
    env.update({k: os.environ[k] for k in KEPT if os.environ.get(k)})
    return Server(command=sys.executable, args=("-m", "pkb_mcp", "serve"), env=env)


def examine(sweep: bool = True) -> Report:
    findings = [_docker_engine(), _gpus(), _nvcc(), _state(), _node()]
    removed = _sweep() if sweep and findings[0].status == "ok" else []
    server = user_server()
    return Report(findings, removed, asdict(server), setups(server))


def _run(argv: list[str], timeout: float = 15.0) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _docker_engine() -> Finding:
    from sandbox.docker import DockerUnavailable, connect
    from sandbox.image import image_tag

    try:
        client = connect()
    except DockerUnavailable as exc:
        return Finding(
            "docker",
            "warn",
            f"{exc}: checks run in the process sandbox, which isolates less (docs/sandbox.md)",
        )
    version = client.version().get("Version", "?")
    tag = image_tag()
    import docker

    try:
        client.images.get(tag)
        image = f"image {tag} present"
    except docker.errors.ImageNotFound:
        image = f"image {tag} not built yet: the first launch builds it from this machine's files (seconds)"
    return Finding("docker", "ok", f"engine {version} answers; {image}")


def _gpus() -> Finding:
    if not shutil.which("nvidia-smi"):
        return Finding("gpus", "warn", "no NVIDIA driver (nvidia-smi not found): CPU runs only, --device cpu")
    listed = _run(["nvidia-smi", "-L"])
    if not listed:
        return Finding("gpus", "warn", "nvidia-smi lists no GPU: CPU runs only, --device cpu")
    names = [line.split(":", 1)[1].split("(")[0].strip() for line in listed.splitlines() if ":" in line]
    kinds = sorted(set(names))
    return Finding("gpus", "ok", f"{len(names)} GPU(s): {', '.join(kinds)}")


def _nvcc() -> Finding:
    from pkb_mcp.compile.toolchain import CompileError, find_nvcc

    try:
        nvcc = find_nvcc()
    except CompileError as exc:
        return Finding("nvcc", "warn", f"{exc} (compile_kernel and CUDA extensions need it)")
    release = next((line for line in nvcc.version.splitlines() if "release" in line), nvcc.version[-60:])
    return Finding("nvcc", "ok", f"{nvcc.path}: {release.strip()}")


def _state() -> Finding:
    try:
        state = config.state_dir()
        with tempfile.NamedTemporaryFile(dir=state, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Finding("state", "fail", f"the state folder is not writable ({exc}); set PKB_STATE_DIR")
    jobs = state / "jobs.sqlite"
    held = f"jobs.sqlite {jobs.stat().st_size / 1e6:.1f} MB" if jobs.exists() else "no jobs yet"
    return Finding("state", "ok", f"{state} writable ({held})")


def _node() -> Finding:
    node = shutil.which("node")
    version = _run([node, "--version"]) if node else None
    if not version:
        return Finding(
            "node", "warn", "no Node: Codex, Gemini CLI and the Inspector need it (npm's node package)"
        )
    major = int(version.lstrip("v").split(".")[0] or 0)
    if major < NODE_FOR_INSPECTOR:
        return Finding(
            "node", "warn", f"{version}: Codex and Gemini CLI run on it; the Inspector 2.12 needs Node 22 or "
            "later (`npm install node@22` in a prefix of its own)",
        )  # fmt: skip
    return Finding("node", "ok", f"{version}")


def _sweep() -> list[str]:
    from pkb_mcp.agents import container
    from sandbox.docker import connect, sweep

    removed: list[str] = []
    with contextlib.suppress(Exception):  # the engine answered a moment ago; a sweep is best effort
        n = sweep(connect())
        removed += [f"{n} sandbox container(s) of pkb servers that are gone"] if n else []
    with contextlib.suppress(Exception):
        removed += [f"agent container {name}" for name in container.sweep()]
    return removed


def text(report: Report) -> str:
    lines = ["pkb doctor: this machine"]
    lines += [f"  {f.status:<5} {f.name:<7} {f.detail}" for f in report.findings]
    if report.removed:
        lines.append("  removed what processes that are gone left: " + "; ".join(report.removed))
    else:
        lines.append("  nothing left by pkb processes that are gone")
    server = " ".join([report.server["command"], *report.server["args"]])
    lines += ["", f"pkb's MCP server on this machine: {server} (its environment spelled out below)"]
    for s in report.setups:
        lines += ["", f"{s.client}: {s.where}", *(f"    {line}" for line in s.text.splitlines())]
        lines.append(f"  check: {s.check}")
        lines += [f"  note: {note}" for note in s.notes]
    return "\n".join(lines)
