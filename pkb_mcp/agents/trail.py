"""What pkb leaves inside an attempt for the attempt to read afterwards: the mark that its MCP server
listed its tools to the client (the preflight of a client that does not report its tools itself), and
the candidate as it was at every check and benchmark the agent ran (the snapshots behind the
correct-against-steps curve).

With pkb's MCP tools, the attempt's server keeps its jobs (jobs.sqlite) and every submitted source
(sources/) in the attempt's own state folder, so the snapshots are its check and bench jobs, in order,
read after the attempt. With `--tools cli`, the `pkb` command the agent's shell runs records each
check and bench into `$PKB_CALLS` (this module's `record_cli_call`). Where the client ran as the user
(`--agent-sandbox none`) it could have written these files too: they are the loop's figures, never
the judgment, which `pkb eval` makes of the collected file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pkb_mcp.agents.records import Snapshot

LISTED_ENV = "PKB_TOOLS_LISTED"  # a file pkb's MCP server writes when it lists its tools
CALLS_ENV = "PKB_CALLS"  # a folder where `pkb check` and `pkb bench` record each call
SNAPSHOT_CAP = 1 << 20


def mark_listed(tools: list[str]) -> None:
    """pkb's MCP server answered tools/list: say so where the attempt looks (once is enough)."""
    path = os.environ.get(LISTED_ENV)
    if not path or os.path.exists(path):
        return
    with contextlib.suppress(OSError):
        tmp = f"{path}.{os.getpid()}.tmp"
        Path(tmp).write_text(json.dumps({"at": time.time(), "tools": tools}))
        os.replace(tmp, path)


def read(folder: Path, name: str, cap: int = SNAPSHOT_CAP) -> bytes | None:
    """A file of the attempt's folders, which a client running as the user could have replaced: read
    through the reader that refuses links, FIFOs and devices and bounds the bytes (sandbox/untrusted.py)."""
    from sandbox.untrusted import LaunchFiles

    return LaunchFiles(folder).read(name, cap)


def _json(folder: Path, name: str) -> Any:
    try:
        return json.loads(read(folder, name, 65536) or b"null")
    except ValueError:
        return None


def listed(path: Path) -> list[str] | None:
    """The tools pkb's server listed to the client, or None if it never did."""
    data = _json(path.parent, path.name)
    if data is None:
        return None
    tools = data.get("tools") if isinstance(data, dict) else None
    return [t for t in tools if isinstance(t, str)] if isinstance(tools, list) else []


def record_cli_call(kind: str, file: Path) -> int | None:
    """A `pkb check` or `pkb bench` of the agent's shell: the file copied, the call noted; its index."""
    folder = os.environ.get(CALLS_ENV)
    if not folder:
        return None
    calls = Path(folder)
    calls.mkdir(parents=True, exist_ok=True)
    index = len(list(calls.glob("*.json")))
    data = file.read_bytes()[:SNAPSHOT_CAP]
    (calls / f"{index:03d}.py").write_bytes(data)
    note = {"kind": kind, "at": time.time(), "sha256": hashlib.sha256(data).hexdigest()}
    (calls / f"{index:03d}.json").write_text(json.dumps(note))
    return index


def record_cli_result(index: int | None, passed: bool | None, speedup: float | None) -> None:
    folder = os.environ.get(CALLS_ENV)
    if index is None or not folder:
        return
    path = Path(folder) / f"{index:03d}.json"
    with contextlib.suppress(OSError, ValueError):
        note = json.loads(path.read_text())
        note.update(passed=passed, speedup=speedup, ended=time.time())
        path.write_text(json.dumps(note))


def _step(ended: float, tool_times: list[float]) -> int:
    """The agent's tool calls by the end of this one, itself included: counted to the call's end, as
    a client may print a call's line only after its server has started the job (Claude Code did, on
    a loaded machine), and the next call cannot begin before this one's result."""
    return sum(1 for t in tool_times if t <= ended)


def from_jobs(state: Path, out: Path, started: float, tool_times: list[float]) -> list[Snapshot]:
    """The check and bench jobs of the attempt's server, as snapshots copied into `out`."""
    from pkb_mcp.jobs.store import JobStore

    db = state / "jobs.sqlite"
    if not db.is_file():
        return []
    found = []
    store = JobStore(db)
    for index, job in enumerate(store.every(("check", "bench"))):
        source = Path(str(job.params.get("path", "")))
        try:
            rel = source.relative_to(state)  # the server's own copy, nowhere else
        except ValueError:
            continue
        data = read(state, str(rel))
        if data is None:
            continue
        found.append(
            _snapshot(
                index,
                job.kind,
                data,
                job.created,
                job.finished or job.created,
                started,
                tool_times,
                out,
                store.result(job.id),
            )
        )
    return found


def from_calls(calls: Path, out: Path, started: float, tool_times: list[float]) -> list[Snapshot]:
    """The checks and benches the agent's `pkb` command recorded (`--tools cli`)."""
    found = []
    for index, note_path in enumerate(sorted(calls.glob("*.json")) if calls.is_dir() else []):
        note = _json(calls, note_path.name)
        data = read(calls, note_path.with_suffix(".py").name)
        if data is None or not isinstance(note, dict) or note.get("kind") not in ("check", "bench"):
            continue
        at = float(note["at"]) if isinstance(note.get("at"), int | float) else started
        ended = float(note["ended"]) if isinstance(note.get("ended"), int | float) else at
        result = {"verdict": "pass" if note.get("passed") else "fail", "speedup": note.get("speedup")}
        found.append(_snapshot(index, note["kind"], data, at, ended, started, tool_times, out, result))
    return found


def _snapshot(
    index: int,
    kind: str,
    data: bytes,
    at: float,
    ended: float,
    started: float,
    tool_times: list[float],
    out: Path,
    result: dict[str, Any] | None,
) -> Snapshot:
    out.mkdir(parents=True, exist_ok=True)
    name = f"{index:03d}-{kind}.py"
    shutil.rmtree(out / name, ignore_errors=True)
    (out / name).write_bytes(data)
    passed, speedup = _outcome(kind, result)
    return Snapshot(
        index=index,
        kind="bench" if kind == "bench" else "check",
        at_s=round(at - started, 3),
        step=_step(ended, tool_times),
        sha256=hashlib.sha256(data).hexdigest(),
        file=f"{out.name}/{name}",
        passed=passed,
        speedup=speedup,
    )


def _outcome(kind: str, result: dict[str, Any] | None) -> tuple[bool | None, float | None]:
    """A job result's pass and credited speedup: a bench's verdict `pass` is its credited time,
    unless the speedup is within noise (measured, not credited: docs/measurement.md)."""
    if not isinstance(result, dict):
        return None, None
    verdict = result.get("verdict")
    if kind == "check":
        return verdict == "pass", None
    speedup = result.get("speedup")
    credited = (
        verdict == "pass" and isinstance(speedup, int | float) and result.get("within_noise") is not True
    )
    return verdict in ("pass", "suspect"), float(speedup) if credited and speedup is not None else None
