"""A solution file's problem from its name (pkb_mcp/runs/pairing.py), in `pkb eval` and in a check or
benchmark given an id: the name wins over the id with a note, an unknown name pairs by the id with a
warning, and a file that names no problem is an error before anything runs. No sandbox runs here."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkb_mcp.errors import UserError
from pkb_mcp.evaluation.batch import _Batch, evaluate, pair_files
from pkb_mcp.evaluation.records import EvalSettings
from pkb_mcp.evaluation.store import EvalStore
from pkb_mcp.models import RunRequest
from pkb_mcp.runs import pairing
from pkb_mcp.runs.run import Run

PUBLISHED = "35_ulysses_all_gather_into_tensor_primitive_cuda.py"  # problem 34 in this suite


def test_the_name_wins_over_an_id_that_names_another_problem():
    paired = pairing.pair(PUBLISHED)
    assert paired.problem is not None and paired.problem.id == 34
    assert (paired.named_id, paired.backend, paired.warning) == (35, "cuda", None)
    assert paired.note is not None
    assert "names problem 34 (ulysses_all_gather_into_tensor_primitive)" in paired.note
    assert "problem 35 (ulysses_all_gather_variable_primitive)" in paired.note
    assert "by its name" in paired.note


def test_an_id_no_problem_has_is_overruled_by_the_name():
    paired = pairing.pair("88_allreduce_triton.py")
    assert paired.problem is not None and paired.problem.id == 1
    assert paired.note is not None and "id 88, no problem here" in paired.note


@pytest.mark.parametrize(
    ("name", "problem", "backend"),
    [
        ("001_allreduce.py", 1, None),  # ours
        ("1_allreduce_cuda.py", 1, "cuda"),  # the original's, the id right
        ("011_allgather_gemm_at.py", 11, None),  # not 12 (allgather_gemm) with a backend "at"
        ("11_allgather_gemm_AT_cuda.py", 11, "cuda"),  # names compared without regard to case
        ("012_allgather_gemm.py", 12, None),
        ("019_blocked_fp8_quantize_triton.py", 19, "triton"),
    ],
)
def test_names_that_agree_with_their_id_pair_without_a_remark(name, problem, backend):
    paired = pairing.pair(name)
    assert paired.problem is not None
    assert (paired.problem.id, paired.backend, paired.remark) == (problem, backend, None)


def test_an_unknown_name_with_a_known_id_pairs_by_the_id_with_a_warning():
    paired = pairing.pair("26_expert_shuffle_cuda.py")
    assert paired.problem is not None and paired.problem.id == 26
    assert paired.note is None and paired.warning is not None
    assert "'expert_shuffle' is no problem's name" in paired.warning
    assert "problem 26 (moe_token_preprocess) by its id" in paired.warning


@pytest.mark.parametrize("name", ["086_gather_once.py", "024_no_allreduce.py", "077_float64.py"])
def test_words_that_describe_a_file_of_a_known_id_do_not_pair_it_elsewhere(name):
    """086_gather_once.py (tests/candidates/legit) once ran as problem 6 (gather) with a backend
    "once": a name found only without its last word decides only one off from the id."""
    paired = pairing.pair(name)
    assert paired.problem is not None and paired.problem.id == int(name[:3]) and paired.note is None
    assert paired.warning is not None and "is no problem's name" in paired.warning
    assert f"problem {int(name[:3])} ({paired.problem.name}) by its id" in paired.warning
    assert pairing.for_request(int(name[:3]), name) == (int(name[:3]), None)


def test_neither_a_known_id_nor_a_known_name_is_an_error_and_no_id_pairs_nothing():
    with pytest.raises(UserError, match=r"999_nothing_torch\.py: neither its id 999 nor its name"):
        pairing.pair("999_nothing_torch.py")
    assert pairing.pair("helper.py").problem is None
    assert pairing.pair(Path("/tmp/solution.py")).problem is None


def test_eval_refuses_files_that_name_no_problem_before_anything_runs(tmp_path):
    batch = tmp_path / "batch"
    batch.mkdir()
    (batch / "001_allreduce_torch.py").write_text("def solution(x):\n    return x\n")
    (batch / "999_nothing_torch.py").write_text("def solution(x):\n    return x\n")
    (batch / "998_nor_this_cuda.py").write_text("def solution(x):\n    return x\n")
    store = tmp_path / "eval.sqlite"
    with pytest.raises(UserError) as refused:
        evaluate([batch], device="cpu", sandbox="process", store=store)
    message = str(refused.value)
    assert message.startswith("2 file(s) name no problem, so nothing was run: ")
    assert "999_nothing_torch.py" in message and "998_nor_this_cuda.py" in message
    assert not store.exists(), "refused before the store (or any job) was made"


class _Scheduler:
    """Takes the batch's submissions; runs nothing."""

    cluster = None

    def __init__(self) -> None:
        self.submitted: list[tuple[str, RunRequest]] = []

    def submit(self, kind: str, request: RunRequest, first: bool = False, then=None) -> str:
        self.submitted.append((kind, request))
        return f"job{len(self.submitted)}"


def test_eval_runs_a_file_against_the_problem_its_name_names_and_says_so(tmp_path):
    published = tmp_path / PUBLISHED
    published.write_text("def solution(*args):\n    return args[0]\n")
    unknown = tmp_path / "26_expert_shuffle_cuda.py"
    unknown.write_text("def solution(*args):\n    return args[0]\n")
    scheduler = _Scheduler()
    batch = _Batch(
        EvalSettings(world_size=2, device="cpu"),
        scheduler,
        EvalStore(tmp_path / "eval.sqlite"),
        rerun=False,
        progress=lambda *_: None,
    )
    paired = pair_files([published, unknown])
    entry = batch.start(published, paired[published])
    assert (entry.base.problem_id, entry.base.problem) == (34, "ulysses_all_gather_into_tensor_primitive")
    assert entry.base.pairing is not None and "by its name" in entry.base.pairing
    other = batch.start(unknown, paired[unknown])
    assert other.base.problem_id == 26
    assert other.base.pairing is not None and "by its id" in other.base.pairing
    assert [(kind, r.problem) for kind, r in scheduler.submitted] == [("check", 34), ("check", 26)]


def test_a_check_given_an_id_runs_against_the_problem_the_file_names(tmp_path):
    published = tmp_path / PUBLISHED
    published.write_text("def solution(*args):\n    return args[0]\n")
    run = Run(RunRequest(problem=35, path=str(published), world_size=2, device="cpu", sandbox="process"))
    assert run.problem.id == 34
    assert any("problem 35 was asked for" in n and "run against 34, by its name" in n for n in run.notes)
    agreed = Run(RunRequest(problem=34, path=str(published), world_size=2, device="cpu", sandbox="process"))
    assert agreed.problem.id == 34 and agreed.notes == []


def test_a_problem_given_by_name_or_a_file_named_otherwise_is_taken_as_given():
    asked = "ulysses_all_gather_variable_primitive"
    assert pairing.for_request(asked, PUBLISHED) == (asked, None)
    assert pairing.for_request(35, "solution.py") == (35, None)
    assert pairing.for_request(35, "26_expert_shuffle_cuda.py") == (35, None)
    assert pairing.for_request("35", "999_nothing_torch.py") == ("35", None)
    # issue 51: an id of no problem is not replaced by the problem the name names; it is refused
    assert pairing.for_request(999, "001_allreduce.py") == (999, None)
    assert pairing.for_request("999", PUBLISHED) == ("999", None)


def test_pairing_imports_only_the_problem_it_pairs():
    """The names are read from the files as text (pkb_mcp/catalogue.py): importing all 87 problem files
    to pair one took a check 4.4 s on a 2-core machine, most of it one problem's inputs importing
    torch's compiler."""
    import subprocess
    import sys

    probe = (
        "from pkb_mcp.runs import pairing\n"
        f"assert pairing.for_request(1, 'x/001_allreduce.py') == (1, None)\n"
        f"assert pairing.pair({PUBLISHED!r}).problem.id == 34\n"
        "from pkb_mcp import problems\n"
        "print(problems._loaded.cache_info().currsize)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.split() == ["2"], f"problems imported: {out}"  # 1 and 34
