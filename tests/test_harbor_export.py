"""`pkb export harbor` (pkb_mcp/agents/harbor.py): the task folders, their task.toml, the oracle, the
environment's source, bad input refused; Harbor's own loader and linter over them and its TrialResult
fields, where an interpreter with harbor==0.26.0 is at hand (harbor needs Python 3.12: set
PKB_HARBOR_PYTHON to one, e.g. a venv's bin/python). No Docker, no ranks."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from pathlib import Path

import pytest

from pkb_mcp import problems
from pkb_mcp.agents import harbor
from pkb_mcp.agents.harbor import export_tasks, oracle_source, source_tar, trial_result_problems
from pkb_mcp.errors import UserError

FILES = ["instruction.md", "task.toml", "solution/solution.py", "solution/solve.sh", "tests/test.sh"]


def _toml(folder: Path) -> dict:
    return tomllib.loads((folder / "task.toml").read_text())


def test_one_folder_per_problem_with_harbor_files(tmp_path):
    out = tmp_path / "tasks"
    folders = export_tasks(out, [1, 31, 1], world_size=2, device="cpu")
    assert [f.name for f in folders] == ["001_allreduce", "031_fused_moe_fwd"]
    assert sorted(p.name for p in out.iterdir()) == ["001_allreduce", "031_fused_moe_fwd"]
    for folder in folders:
        for name in [*FILES, "environment/Dockerfile", "environment/pkb.tar.gz"]:
            assert (folder / name).is_file(), name
        for script in ("solution/solve.sh", "tests/test.sh"):
            assert os.access(folder / script, os.X_OK)
    test_sh = (out / "001_allreduce" / "tests" / "test.sh").read_text()
    assert "pkb check 1 /app/solution.py --variant pkb --world-size 2 --size pkb --device cpu" in test_sh
    assert "/logs/verifier/reward.json" in test_sh and '{"reward": %s}' in test_sh
    assert (
        "cp /solution/solution.py /app/solution.py" in (out / "001_allreduce/solution/solve.sh").read_text()
    )


def test_task_toml_holds_the_environment_the_verifier_and_the_server(tmp_path):
    (cuda,) = export_tasks(tmp_path / "cuda", [1], world_size=4, device="cuda")
    t = _toml(cuda)
    assert t["schema_version"] == harbor.SCHEMA_VERSION and t["artifacts"] == ["/app/solution.py"]
    assert "task" not in t  # Harbor names the task by its folder, as pkb's records do
    meta = t["metadata"]
    assert (meta["pkb_problem"], meta["name"], meta["variant"]) == (1, "allreduce", "pkb")
    assert (meta["world_size"], meta["size"], meta["device"]) == (4, "pkb", "cuda")
    assert t["verifier"]["environment_mode"] == "separate" and t["verifier"]["env"] == {"PKB_BENCH": "1"}
    assert t["verifier"]["timeout_sec"] > 0 and t["agent"]["timeout_sec"] > 0
    env = t["environment"]
    assert env["gpus"] == 4 and env["workdir"] == "/app" and "docker_image" not in env
    (server,) = env["mcp_servers"]
    assert server == {"name": "pkb", "transport": "streamable-http", "url": "http://127.0.0.1:8765/mcp"}
    assert "pkb serve --transport http --host 127.0.0.1 --port 8765" in env["healthcheck"]["command"]

    (cpu,) = export_tasks(
        tmp_path / "cpu",
        [1],
        world_size=2,
        device="cpu",
        image="pkb-harbor:local",
        mcp_url="https://n:8765/mcp",
    )
    t = _toml(cpu)
    env = t["environment"]
    assert env["docker_image"] == "pkb-harbor:local" and "gpus" not in env and "healthcheck" not in env
    assert env["mcp_servers"] == [
        {
            "name": "pkb",
            "transport": "streamable-http",
            "url": "https://n:8765/mcp",
            "headers": {"Authorization": "Bearer ${PKB_TOKEN}"},
        }
    ]
    assert t["verifier"]["env"] == {"PKB_BENCH": "0"}
    assert not (cpu / "environment").exists()  # the task names its image


def test_instruction_is_the_attempt_text_and_where_the_file_goes(tmp_path):
    (folder,) = export_tasks(tmp_path / "t", [1], world_size=2, device="cpu")
    text = (folder / "instruction.md").read_text()
    assert text.startswith("Write a faster multi-GPU implementation of problem 1 (allreduce).")
    assert "Write your solution to /app/solution.py" in text
    assert "problem=1, world_size=2, size='pkb', device='cpu' and path='/app/solution.py'" in text
    assert "no GPU" in text and "Reference source:" in text
    (remote,) = export_tasks(tmp_path / "r", [1], mcp_url="http://gpu:8765/mcp")
    assert "source=<your file's text>" in (remote / "instruction.md").read_text()


@pytest.mark.parametrize("variant", problems.VARIANTS)
def test_every_oracle_defines_the_references_solution(variant):
    for p in problems.suite(variant).values():
        source = oracle_source(p)
        namespace: dict = {}
        exec(compile(source, f"oracle_{p.id}", "exec", dont_inherit=True), namespace)
        assert f"solution{inspect.signature(namespace['solution'])}" == p.signature, p.id
        for judge_only in ("make_inputs", "traffic", "check_world_size", "SIZES", "TOLERANCE"):
            assert judge_only not in namespace, (p.id, judge_only)


def test_the_oracle_keeps_what_solution_needs():
    source = oracle_source(problems.resolve(31))
    assert "def route(" in source and "_all_gather = " in source  # helpers and a module-level alias
    assert "# torch 2.13 renamed all_gather_into_tensor" in source  # the comment above it too
    compile(source, "oracle_31", "exec")


def test_the_environments_source_holds_pkb_and_this_problem_only(tmp_path):
    p = problems.resolve(1)
    data = source_tar(p)
    assert data == source_tar(p)  # the same bytes each time: Docker's cache holds
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    assert "pkb/pkb_mcp/__init__.py" in names and "pkb/harness/worker.py" in names
    assert "pkb/sandbox/__init__.py" in names and not any("__pycache__" in n for n in names)
    assert [n for n in names if n.startswith("pkb/problems/")] == [
        "pkb/problems/001_allreduce.py",
        *(["pkb/problems/original/001_allreduce.py"] if 1 in problems.suite("original") else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkb")}
    env.pop("PKB_PROBLEMS_DIR", None)
    listed = subprocess.run(
        [sys.executable, "-m", "pkb_mcp", "problems", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in json.loads(listed.stdout)] == [1]


def test_the_dockerfile_pins_pkbs_dependencies():
    import importlib.metadata

    cuda, cpu = harbor.dockerfile("cuda"), harbor.dockerfile("cpu")
    assert f"ARG BASE={harbor.BASE_IMAGES['cuda']}" in cuda and "FROM ${BASE}" in cuda
    assert f"mcp=={importlib.metadata.version('mcp')}" in cuda and "torch" not in cuda.split("RUN")[1]
    assert harbor.CPU_TORCH_INDEX in cpu and "ADD pkb.tar.gz /opt/" in cpu


def test_an_export_again_replaces_its_own_folders(tmp_path):
    out = tmp_path / "tasks"
    export_tasks(out, [1, 2], world_size=2)
    (out / "001_allreduce" / "stale.txt").write_text("left from before")
    export_tasks(out, [1], world_size=4)
    assert not (out / "001_allreduce" / "stale.txt").exists()
    assert _toml(out / "001_allreduce")["metadata"]["world_size"] == 4
    assert (out / "002_allgather" / "task.toml").is_file()  # another export's task stays


@pytest.mark.parametrize(
    ("ids", "options", "words"),
    [
        ([999], {}, "problem 999 does not exist"),
        ([11], {"world_size": 3}, "cannot run at world size 3"),
        ([1], {"size": "huge"}, "no size preset 'huge'"),
        ([1], {"variant": "mine"}, "variant 'mine'"),
        ([1], {"device": "tpu"}, "device must be 'cpu' or 'cuda', not 'tpu'"),
        ([1], {"mcp_url": "gpu-node:8765"}, "not an http(s) URL"),
        ([1], {"image": "two words"}, "not a Docker image name"),
        ([], {}, "no problems to export"),
    ],
)
def test_bad_input_is_refused_with_a_sentence_before_anything_is_written(tmp_path, ids, options, words):
    out = tmp_path / "tasks"
    with pytest.raises(UserError) as caught:
        export_tasks(out, ids, **options)
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert not out.exists()


def test_a_folder_holding_other_things_is_refused(tmp_path):
    out = tmp_path / "tasks"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"already holds notes\.txt, which no pkb export wrote"):
        export_tasks(out, [1])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "notes.txt").unlink()
    (out / "001_allreduce").mkdir()  # a folder of the same name that pkb did not write
    with pytest.raises(UserError, match="already holds 001_allreduce"):
        export_tasks(out, [1])
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(UserError, match="is a file"):
        export_tasks(afile, [1])


# ---------------------------------------------------------------- Harbor's trial result

ATTEMPT_RESULT = {  # the shape of pkb agents run's per-attempt result.json (pkb_mcp/agents/run.py)
    "task_name": "001_allreduce",
    "trial_name": "001_allreduce__attempt-0",
    "agent_info": {"name": "claude", "version": "2.1.332", "model_info": {"name": "claude-sonnet-4-5"}},
    "agent_result": {"n_input_tokens": 1200, "n_cache_tokens": 800, "n_output_tokens": 300, "cost_usd": 0.02},
    "verifier_result": {"rewards": {"reward": 1.0}},
    "exception_info": None,
    "started_at": "2026-12-02T10:00:00+00:00",
    "finished_at": "2026-12-02T10:05:00+00:00",
    "pkb": {"status": "done"},
}


def test_a_harbor_style_trial_result_parses():
    assert trial_result_problems(ATTEMPT_RESULT) == []
    broken = {**ATTEMPT_RESULT, "agent_info": {"name": "claude"}, "exception_info": {"exception_type": "x"}}
    assert trial_result_problems(broken) == [
        "agent_info.version is missing",
        "exception_info.exception_message is missing",
        "exception_info.exception_traceback is missing",
        "exception_info.occurred_at is missing",
    ]
    assert trial_result_problems({"task_name": "t", "trial_name": "t", "agent_info": "claude"}) == [
        "agent_info is not an object"
    ]


# ---------------------------------------------------------------- Harbor itself, where it is installed


def _harbor_python() -> str | None:
    if importlib.util.find_spec("harbor") is not None:
        return sys.executable
    return os.environ.get("PKB_HARBOR_PYTHON") or None


def _in_harbor(script: str, *args: str) -> str:
    python = _harbor_python()
    if python is None:
        pytest.skip("no interpreter with harbor==0.26.0 (set PKB_HARBOR_PYTHON)")
    done = subprocess.run(
        [python, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_harbors_loader_and_linter_take_the_tasks(tmp_path):
    export_tasks(tmp_path / "gpu", [1, 31], world_size=4, device="cuda")
    export_tasks(
        tmp_path / "cpu", [1, 2], world_size=2, device="cpu", image="pkb:x", mcp_url="http://h:1/mcp"
    )
    folders = sorted(str(p) for p in tmp_path.glob("*/*"))
    out = _in_harbor(
        """
        import json, subprocess, sys
        from pathlib import Path
        import harbor
        from harbor.models.task.task import Task
        from harbor.models.task.verifier_mode import resolve_task_verifier_mode
        rows = []
        for folder in sys.argv[1:]:
            task = Task(folder)
            c = task.config
            rows.append({
                "version": harbor.__version__ if hasattr(harbor, "__version__") else None,
                "name": task.name, "valid": Task.is_valid_dir(folder), "gpus": c.environment.gpus,
                "image": c.environment.docker_image, "mode": resolve_task_verifier_mode(c).value,
                "servers": [(s.name, s.transport, s.url) for s in c.environment.mcp_servers],
                "instruction": task.instruction.startswith("Write a faster"),
            })
        lint = subprocess.run([str(Path(sys.executable).parent / "harbor"), "lint", *sys.argv[1:]],
                              capture_output=True, text=True)
        print(json.dumps({"rows": rows, "lint": [lint.returncode, lint.stdout + lint.stderr]}))
        """,
        *folders,
    )
    got = json.loads(out.splitlines()[-1])
    assert got["lint"] == [0, ""]
    rows = {(Path(f).parent.name, r["name"]): r for f, r in zip(folders, got["rows"], strict=True)}
    assert rows["gpu", "001_allreduce"]["gpus"] == 4 and rows["cpu", "002_allgather"]["image"] == "pkb:x"
    for row in got["rows"]:
        assert row["valid"] and row["instruction"] and row["mode"] == "separate"
        assert row["servers"][0][:2] == ["pkb", "streamable-http"]


def test_the_recorded_fields_are_harbors_trial_result():
    out = _in_harbor(
        """
        import json, sys
        from harbor.models.trial import result as r
        from harbor.models.agent.context import AgentContext
        from harbor.models.verifier.result import VerifierResult
        models = {"": r.TrialResult, "agent_info": r.AgentInfo, "agent_info.model_info": r.ModelInfo,
                  "agent_result": AgentContext, "verifier_result": VerifierResult,
                  "exception_info": r.ExceptionInfo}
        fields = {k: {n: f.is_required() for n, f in m.model_fields.items()} for k, m in models.items()}
        sample = json.loads(sys.argv[1])
        for key in ("agent_info", "agent_result", "verifier_result"):
            models[key].model_validate(sample[key])
        print(json.dumps(fields))
        """,
        json.dumps(ATTEMPT_RESULT),
    )
    fields = json.loads(out.splitlines()[-1])
    for name, required in harbor.TRIAL_RESULT.items():
        assert fields[""][name] is required, name
    for path, spec in harbor.NESTED.items():
        for name, required in spec.items():
            assert fields[path][name] is required, (path, name)
    left_out = {n for n, req in fields[""].items() if req} - set(harbor.TRIAL_RESULT)
    assert left_out == {"trial_uri", "task_id", "task_checksum", "config"}
