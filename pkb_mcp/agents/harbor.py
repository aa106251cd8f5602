"""`pkb export harbor DIR`: one Harbor task per problem (docs/harbor.md), so that Harbor's agents and
cloud environments, and what runs Harbor tasks (Inspect through inspect-harbor), run pkb's problems.

A task folder, in Harbor 0.26.0's format, named by pkb's `NNN_slug`:

    instruction.md       the attempt_problem text, where the solution goes and how to reach pkb
    task.toml            the environment (the world size's GPUs, pkb's MCP server over HTTP), the
                         verifier in a fresh environment of its own, the timeouts
    environment/         a Dockerfile and pkb's source with this problem (not written with `image`:
                         the task then names that image)
    solution/            the oracle: the problem's reference as a solution file, and solve.sh
    tests/test.sh        the verifier: `pkb check` of /app/solution.py, reward.json written

The verifier judges with `pkb check` inside the task's own environment rather than through an MCP
server: Harbor gives the verifier the task's GPUs, runs it in a fresh copy of the environment with
only /app/solution.py carried over (`environment_mode = "separate"`), so nothing the agent did to
its own environment (a patched pkb, a leftover process) reaches the judge, and no server, token or
network is needed to grade. The reward is one binary key, the only form Harbor computes pass@k for;
the verdict's and the benchmark's JSON stay beside it in /logs/verifier.
"""

from __future__ import annotations

import ast
import gzip
import importlib.metadata
import io
import json
import re
import shlex
import shutil
import tarfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pkb_mcp import config, problems, python_text, service
from pkb_mcp.agents.task import attempt_text
from pkb_mcp.errors import UserError
from pkb_mcp.models import ProblemDetail, RunRequest

HARBOR_VERSION = "0.26.0"  # the Harbor whose task format these folders follow (and were loaded by)
SCHEMA_VERSION = "1.4"  # its task.toml schema
SOLUTION = "/app/solution.py"  # what the agent writes and the verifier judges
MCP_PORT = 8765
LOCAL_MCP_URL = f"http://127.0.0.1:{MCP_PORT}/mcp"  # the server the environment starts for its agent
TOKEN_VARIABLE = "PKB_TOKEN"  # the bearer token of a server given by mcp_url, from the user's shell
BASE_IMAGES = {  # the Dockerfile's default base: nvcc for load_inline on cuda; a plain Python on cpu
    "cuda": "pytorch/pytorch:2.11.0-cuda13.0-cudnn9-devel",
    "cpu": "python:3.11-slim",
}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
AGENT_TIMEOUT_S = 3600.0
VERIFIER_TIMEOUT_S = {"cuda": 1800.0, "cpu": 900.0}  # a check of five trials, and on cuda a benchmark
BUILD_TIMEOUT_S = 1800.0  # the CUDA base image alone is several GB
MARKER = "pkb_problem"  # the [metadata] key that marks a folder as one this module wrote


@dataclass(frozen=True)
class Settings:
    """What every task of one export shares."""

    variant: str
    world_size: int
    size: str
    device: str
    image: str | None
    mcp_url: str | None

    @property
    def check_options(self) -> str:
        return (
            f"--variant {self.variant} --world-size {self.world_size} --size {shlex.quote(self.size)} "
            f"--device {self.device}"
        )


def export_tasks(
    out_dir: Path,
    problem_ids: list[int],
    *,
    variant: str = "pkb",
    world_size: int = 4,
    size: str = "pkb",
    device: str = "cuda",
    image: str | None = None,
    mcp_url: str | None = None,
) -> list[Path]:
    """Write one Harbor task folder per problem into `out_dir` and return them, in the order given.

    `image`: a Docker image with pkb installed for the tasks to name (one a cloud environment can
    pull, or one built locally); without it every task carries a Dockerfile that builds one.
    `mcp_url`: a pkb server the agent reaches over HTTP with `Authorization: Bearer $PKB_TOKEN`;
    without it the environment starts its own on loopback before the agent does. Bad input is
    refused with a UserError before anything is written.
    """
    out_dir = Path(out_dir)
    s = Settings(variant, world_size, size, device, image, mcp_url)
    _check_settings(s)
    ids = list(dict.fromkeys(problem_ids))  # a problem named twice is written once
    if not ids:
        raise UserError("no problems to export; name at least one problem id")
    details = [service.show_problem(pid, world_size, size, variant) for pid in ids]
    tasks = {f"{d.id:03d}_{d.name}": task_files(d, problems.resolve(d.id, variant), s) for d in details}
    _check_out_dir(out_dir)
    written = []
    for name, files in tasks.items():
        folder = out_dir / name
        if folder.exists():
            shutil.rmtree(folder)  # an earlier export of this problem (_check_out_dir made sure)
        for relative, content in files.items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
            if path.suffix == ".sh":
                path.chmod(0o755)
        written.append(folder)
    return written


def _check_settings(s: Settings) -> None:
    RunRequest.of(path="", device=s.device)  # a device the runs accept
    if s.image is not None and (not s.image.strip() or re.search(r"\s", s.image)):
        raise UserError(f"image {s.image!r} is not a Docker image name; pass one such as pkb-harbor:cuda")
    if s.mcp_url is not None:
        url = urlparse(s.mcp_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise UserError(
                f"mcp_url {s.mcp_url!r} is not an http(s) URL; pass the address of `pkb serve --transport "
                "http`, such as https://gpu-node:8765/mcp"
            )


def _check_out_dir(out_dir: Path) -> None:
    """`out_dir` must be new, empty, or hold only task folders an earlier export wrote."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; pass a folder for the tasks")
    for entry in sorted(out_dir.iterdir()) if out_dir.is_dir() else []:
        if not _is_exported_task(entry):
            raise UserError(
                f"{out_dir} already holds {entry.name}, which no pkb export wrote; pass an empty or a new "
                "folder"
            )


def _is_exported_task(folder: Path) -> bool:
    toml = folder / "task.toml"
    if folder.is_symlink() or not folder.is_dir() or toml.is_symlink() or not toml.is_file():
        return False
    try:
        return MARKER in tomllib.loads(toml.read_text()).get("metadata", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def task_files(d: ProblemDetail, p: problems.Problem, s: Settings) -> dict[str, str | bytes]:
    """A task folder's files by their path in it."""
    files: dict[str, str | bytes] = {
        "instruction.md": instruction(d, s),
        "task.toml": task_toml(d, s),
        "solution/solution.py": oracle_source(p),
        "solution/solve.sh": SOLVE_SH,
        "tests/test.sh": test_sh(d, s),
    }
    if s.image is None:
        files["environment/Dockerfile"] = dockerfile(s.device)
        files["environment/pkb.tar.gz"] = source_tar(p)
    return files


# ---------------------------------------------------------------- instruction.md


def instruction(d: ProblemDetail, s: Settings) -> str:
    """The attempt_problem text, then where the file goes, how it is judged and how to reach pkb."""
    args = f"problem={d.id}, world_size={s.world_size}, size={s.size!r}, device={s.device!r}"
    if s.variant != "pkb":
        args += f", variant={s.variant!r}"
    if s.mcp_url is None:
        tools = (
            f"pkb's MCP server `pkb` ({LOCAL_MCP_URL}, started in this environment) has the tools "
            f"run_correctness, benchmark, profile, roofline, compile_kernel and get_reference: call them "
            f"with {args} and path={SOLUTION!r}."
        )
    else:
        tools = (
            f"pkb's MCP server `pkb` ({s.mcp_url}) has the tools run_correctness, benchmark, profile, "
            f"roofline, compile_kernel and get_reference: call them with {args} and source=<your file's "
            f"text> (that server does not see this environment's files)."
        )
    lines = [
        attempt_text(d),
        f"Write your solution to {SOLUTION} (that file is what is judged when you stop). {tools} The "
        f"same checks run in a shell: `pkb check {d.id} {SOLUTION} {s.check_options}`, then "
        f"`pkb bench {d.id} {SOLUTION} {s.check_options}`.",
        f"Judging: when you stop, {SOLUTION} alone is copied into a fresh copy of this environment and "
        f"`pkb check` runs it as above (fresh random inputs, every rank's outputs compared, in every "
        f"trial): correct earns reward 1, anything else 0.",
    ]
    if s.device == "cpu":
        lines.append(
            "This environment has no GPU: the ranks run on CPU (torch.distributed with gloo, device "
            "'cpu'), so CUDA, Triton and symmetric memory are not available here and timings are not "
            "the GPUs'."
        )
    return "\n\n".join(lines) + "\n"


# ---------------------------------------------------------------- task.toml


def task_toml(d: ProblemDetail, s: Settings) -> str:
    """task.toml in Harbor's schema: no [task] section, so Harbor names the task by its folder, as
    pkb's own records name an attempt's problem."""
    metadata: dict[str, Any] = {
        MARKER: d.id,
        "name": d.name,
        "category": d.category,
        "source": d.source,
        "summary": d.summary,
        "variant": s.variant,
        "world_size": s.world_size,
        "size": s.size,
        "device": s.device,
        "pkb_version": _pkb_version(),
        "harbor_version": HARBOR_VERSION,
    }
    environment: dict[str, Any] = {"workdir": "/app", "build_timeout_sec": BUILD_TIMEOUT_S}
    if s.image is not None:
        environment["docker_image"] = s.image
    if s.device == "cuda":
        environment.update(
            gpus=s.world_size, gpu_types=["H200"], cpus=4 * s.world_size, memory_mb=32768 * s.world_size
        )
    server: dict[str, Any] = {"name": "pkb", "transport": "streamable-http"}
    if s.mcp_url is None:
        server["url"] = LOCAL_MCP_URL
    else:
        server.update(url=s.mcp_url, headers={"Authorization": f"Bearer ${{{TOKEN_VARIABLE}}}"})
    parts = [
        f"# A Harbor {HARBOR_VERSION} task: pkb problem {d.id} ({d.name}), written by `pkb export harbor`.",
        _toml_table(None, {"schema_version": SCHEMA_VERSION, "artifacts": [SOLUTION]}),
        _toml_table("metadata", metadata),
        _toml_table(
            "verifier",
            {
                "timeout_sec": VERIFIER_TIMEOUT_S[s.device],
                "environment_mode": "separate",
                "env": {"PKB_BENCH": "1" if s.device == "cuda" else "0"},
            },
        ),
        _toml_table("agent", {"timeout_sec": AGENT_TIMEOUT_S}),
        _toml_table("environment", environment),
    ]
    if s.mcp_url is None:
        parts.append(_toml_table("environment.healthcheck", _server_healthcheck()))
    parts.append(_toml_table("environment.mcp_servers", server, array=True))
    return "\n\n".join(parts) + "\n"


def _server_healthcheck() -> dict[str, Any]:
    """Harbor runs the healthcheck in the agent's environment until it passes, before the agent is
    set up: the first run starts pkb's server (once: the pid file), the later ones pass when it
    answers. A container is the isolation here, so the server runs launches in its process backend."""
    serve = (
        f"pkb serve --transport http --host 127.0.0.1 --port {MCP_PORT} --allow-process-sandbox "
        f"--root /app > /tmp/pkb-serve.log 2>&1 < /dev/null"
    )
    probe = f"python -c 'import socket; socket.create_connection((\"127.0.0.1\", {MCP_PORT}), 2)'"
    start = f"[ -f /tmp/pkb-serve.pid ] || {{ setsid nohup {serve} & echo $! > /tmp/pkb-serve.pid; }}"
    return {
        "command": f"{probe} 2>/dev/null || {{ {start}; exit 1; }}",
        "interval_sec": 2.0,
        "timeout_sec": 30.0,
        "start_period_sec": 120.0,
        "start_interval_sec": 2.0,
        "retries": 3,
    }


def _toml_table(name: str | None, values: dict[str, Any], array: bool = False) -> str:
    """One TOML table (`[name]`, `[[name]]` with `array`, the top level without a name): scalars and
    lists as key = value, dicts as inline tables."""
    head = [] if name is None else [f"[[{name}]]" if array else f"[{name}]"]
    return "\n".join(head + [f"{key} = {_toml_value(value)}" for key, value in values.items()])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


# ---------------------------------------------------------------- the verifier and the oracle

TEST_SH = """\
#!/usr/bin/env bash
# Harbor's verifier for pkb problem {id} ({name}): `pkb check` judges {solution} and the reward goes
# to /logs/verifier/reward.json: {{"reward": 1}} when it is correct on every rank in every trial, else
# {{"reward": 0}}. When pkb cannot judge at all (exit 2: its environment), no reward is written, so
# Harbor records the trial as an error, never as the agent's failure. The verdict's JSON is kept in
# check.json; with PKB_BENCH=1 (task.toml's [verifier] env) a correct file is also benchmarked
# (bench.json: speedup against the reference), which leaves the reward as it is.
set -u
logs=/logs/verifier
mkdir -p "$logs"
export PKB_STATE_DIR="${{PKB_STATE_DIR:-/tmp/pkb-state}}"
reward() {{ printf '{{"reward": %s}}\\n' "$1" > "$logs/reward.json"; }}
if [ ! -f {solution} ]; then
    echo "no file at {solution}: reward 0"
    reward 0
    exit 0
fi
pkb check {id} {solution} {options} --sandbox process --json > "$logs/check.json"
verdict=$?
case $verdict in
    0) reward 1 ;;
    1) reward 0 ;;
    *) echo "pkb check could not judge (exit $verdict); no reward written"; exit "$verdict" ;;
esac
if [ "$verdict" = 0 ] && [ "${{PKB_BENCH:-0}}" = 1 ]; then
    pkb bench {id} {solution} {options} --sandbox process --json > "$logs/bench.json" || true
fi
exit 0
"""

SOLVE_SH = f"""\
#!/usr/bin/env bash
# Harbor's oracle: the problem's reference, written where the agent's solution goes.
set -eu
mkdir -p {Path(SOLUTION).parent}
cp /solution/solution.py {SOLUTION}
"""


def test_sh(d: ProblemDetail, s: Settings) -> str:
    return TEST_SH.format(id=d.id, name=d.name, solution=SOLUTION, options=s.check_options)


def oracle_source(p: problems.Problem) -> str:
    """The problem's reference as a solution file: its imports, `solution` and every top-level
    definition `solution` needs (transitively), in the file's order with the comments just above
    them; what only the judge reads (inputs, sizes, tolerance, traffic, metadata) left out."""
    text = p.path.read_text()
    lines = text.splitlines()
    body = python_text.parse(text).body
    keep = [isinstance(node, (ast.Import, ast.ImportFrom)) for node in body]
    needed, seen = ["solution"], set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        for i, node in enumerate(body):
            if name in _defines(node) and not keep[i]:
                keep[i] = True
                needed.extend(_names_used(node))
    header = (
        f'"""Oracle for Harbor: pkb problem {p.id} ({p.name}, {p.variant} variant), the reference\n'
        f'solution() of {p.path.name} with what only the judge reads left out."""'
    )
    chosen = [node for node, k in zip(body, keep, strict=True) if k]
    imports = [_segment(n, lines) for n in chosen if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [_segment(n, lines) for n in chosen if not isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n\n\n".join([header + "\n\n" + "\n".join(imports), *rest]) + "\n"


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _names_used(node: ast.stmt) -> Iterable[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Global):
            yield from n.names


def _segment(node: ast.stmt, lines: list[str]) -> str:
    """The node's lines, its decorators and the comment lines just above it included."""
    first = min([node.lineno] + [dec.lineno for dec in getattr(node, "decorator_list", [])])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return "\n".join(lines[first - 1 : node.end_lineno])


# ---------------------------------------------------------------- the environment

DOCKERFILE = """\
# pkb's environment for one Harbor task (written by `pkb export harbor`): PyTorch, pkb at /opt/pkb with
# this task's problem, the `pkb` command. Harbor builds it; another base with the same Python and
# torch may be passed as --build-arg BASE=...
ARG BASE={base}
FROM ${{BASE}}
ENV PYTHONUNBUFFERED=1 PYTHONPATH=/opt/pkb \\
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RUN {torch}pip install --no-cache-dir {requirements}
ADD pkb.tar.gz /opt/
RUN printf '#!/bin/sh\\nexec python -m pkb_mcp "$@"\\n' > /usr/local/bin/pkb \\
 && chmod 755 /usr/local/bin/pkb && mkdir -p /app
WORKDIR /app
"""


def dockerfile(device: str) -> str:
    """The Dockerfile: pkb's dependencies pinned at the versions installed here (torch from the base
    on cuda; on cpu torch's CPU wheel of this version)."""
    torch = ""
    if device == "cpu":
        version = importlib.metadata.version("torch").split("+")[0]
        torch = f"pip install --no-cache-dir torch=={version} --index-url {CPU_TORCH_INDEX} && "
    return DOCKERFILE.format(base=BASE_IMAGES[device], torch=torch, requirements=" ".join(_requirements()))


def _requirements() -> list[str]:
    """pkb's own dependencies (no extras, no torch), each pinned at its installed version."""
    try:
        declared = importlib.metadata.requires("pkb-mcp") or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise UserError(
            "pkb-mcp is not installed as a package; run `pip install -e .` in pkb's checkout"
        ) from exc
    pinned = []
    for requirement in declared:
        if "extra ==" in requirement:
            continue
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        if match and match.group(0).lower() != "torch":
            pinned.append(f"{match.group(0)}=={importlib.metadata.version(match.group(0))}")
    return sorted(pinned)


def _pkb_version() -> str:
    try:
        return importlib.metadata.version("pkb-mcp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def source_tar(p: problems.Problem) -> bytes:
    """pkb/ as the Dockerfile unpacks it at /opt: the pkb_mcp, harness and sandbox packages and this
    problem's files only (its pkb file, and its original variant's where it has one), so that the
    agent's `pkb problems` lists this task's problem. Byte for byte the same for the same sources."""
    root = config.HARNESS_ROOT
    files: dict[str, Path] = {}
    for package in (config.PACKAGE_DIR, root / "harness", root / "sandbox"):
        for path in sorted(package.rglob("*")):
            relative = path.relative_to(package)
            if path.is_file() and "__pycache__" not in relative.parts and relative.parts[0] != "_problems":
                files[f"pkb/{package.name}/{relative.as_posix()}"] = path
    ours = problems.resolve(p.id)
    files[f"pkb/problems/{ours.path.name}"] = ours.path
    original = problems.suite("original").get(p.id)
    if original is not None:
        files[f"pkb/problems/original/{original.path.name}"] = original.path
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as tar,
    ):
        for name in sorted(files):
            data = files[name].read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# ---------------------------------------------------------------- Harbor's trial result

# The fields of Harbor 0.26.0's TrialResult (harbor.models.trial.result) that pkb's per-attempt
# result.json takes, and of the models nested in them: each name with whether Harbor requires it.
# TrialResult itself also requires trial_uri, task_id, task_checksum and config (Harbor's own trial
# configuration), which pkb's subset leaves out; Harbor's extra keys (pkb's "pkb") are not its.
TRIAL_RESULT: dict[str, bool] = {
    "task_name": True,
    "trial_name": True,
    "agent_info": True,
    "agent_result": False,
    "verifier_result": False,
    "exception_info": False,
    "started_at": False,
    "finished_at": False,
}
NESTED: dict[str, dict[str, bool]] = {
    "agent_info": {"name": True, "version": True, "model_info": False},  # AgentInfo
    "agent_info.model_info": {"name": True, "provider": False},  # ModelInfo
    "agent_result": {  # AgentContext (n_input_tokens counts the cached ones too)
        "n_input_tokens": False,
        "n_cache_tokens": False,
        "n_output_tokens": False,
        "cost_usd": False,
    },
    "verifier_result": {"rewards": False},  # VerifierResult: {key: int or float}
    "exception_info": {  # ExceptionInfo
        "exception_type": True,
        "exception_message": True,
        "exception_traceback": True,
        "occurred_at": True,
    },
}


def trial_result_problems(data: dict[str, Any]) -> list[str]:
    """What keeps `data` (a result.json) from being the subset of Harbor's TrialResult above: a
    required field missing, or a nested value that is not an object; [] when nothing does."""
    found = []

    def fields(where: str, value: Any, spec: dict[str, bool]) -> None:
        if not isinstance(value, dict):
            found.append(f"{where} is not an object")
            return
        found.extend(f"{where}.{k} is missing" for k, required in spec.items() if required and k not in value)

    fields("result", data, TRIAL_RESULT)
    for path, spec in NESTED.items():
        value: Any = data
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            fields(path, value, spec)
    return found
