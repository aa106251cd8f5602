"""bench/scripts/side_by_side.py: the original harness's verdict read from what its run_local.py prints,
and the agreement of the two sides, with a disagreement explained only by a named protection. No
launch runs here."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scripts" / "side_by_side.py"


def load():
    spec = importlib.util.spec_from_file_location("side_by_side", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["side_by_side"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


sbs = load()


def printed(all_ok, trials, **extra):
    """run_local.py's stdout in eval mode: its trial lines, its summary, its PKB_EVAL_JSON line."""
    payload = {"version": 1, "mode": "eval", "all_ok": all_ok, "interrupted": False, "trials": trials}
    return "\n".join(
        [
            "Local (torchrun)",
            "Submitting reference (trial 0) (reference)...",
            "  Job completed.",
            "all trials match" if all_ok else "mismatch",
            "PKB_EVAL_JSON:" + json.dumps({**payload, **extra}),
            "",
        ]
    )


def trial(number, result, **extra):
    names = ["rank_0.pt", "rank_1.pt"]
    base = {"trial": number, "reference_returncode": 0, "solution_returncode": 0}
    base |= {"reference_artifact_names": names, "solution_artifact_names": names, "result": result}
    return base | extra


def test_every_trial_matching_is_a_pass():
    out = printed(True, [trial(0, "match"), trial(1, "match")])
    assert sbs.original_verdict(out, "", 0) == ("pass", "2 trial(s) match")


def test_a_mismatch_is_a_fail_naming_the_trial_the_rank_file_and_the_difference():
    compare = {
        "ok": False,
        "kind": "tensor_mismatch",
        "errors": ["(root): tensors not allclose (atol=0.01, rtol=0.01); max_abs_diff=1"],
        "per_file": [{"file": "rank_0.pt", "ok": True}, {"file": "rank_1.pt", "ok": False}],
    }
    out = printed(False, [trial(0, "match"), trial(1, "tensor_mismatch", compare=compare)])
    verdict, why = sbs.original_verdict(out, "", 1)
    assert verdict == "fail"
    assert why == "trial 1: rank_1.pt: (root): tensors not allclose (atol=0.01, rtol=0.01); max_abs_diff=1"


def test_its_own_reference_failing_gives_no_verdict_and_says_why():
    stderr = "Traceback (most recent call last):\n  File x\nRuntimeError: No CUDA GPUs are available\n"
    failed = trial(
        0,
        "no_artifacts",
        reference_returncode=1,
        reference_artifact_names=[],
        solution_artifact_names=[],
        reference_job={"returncode": 1, "outputs_stderr": stderr},
    )
    verdict, why = sbs.original_verdict(printed(False, [failed]), "", 1)
    assert verdict == "n/a"
    assert why == "its reference did not run: RuntimeError: No CUDA GPUs are available"


def test_the_solutions_job_failing_is_a_fail():
    stderr = (
        "[rank 1/2] Traceback\n  ...\nNameError: name 'dist' is not defined\nE0101 failed\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\nworker.py FAILED\n"
    )
    failed = trial(
        0,
        "no_artifacts",
        solution_returncode=1,
        solution_artifact_names=[],
        solution_job={"returncode": 1, "outputs_stderr": stderr},
    )
    verdict, why = sbs.original_verdict(printed(False, [failed]), "", 1)
    assert verdict == "fail"
    assert why == "trial 0: the solution's job failed (exit 1): NameError: name 'dist' is not defined"


def test_no_eval_line_is_no_verdict():
    stderr = "Error: no file for problem '1_allreduce', backend 'cuda'.\n  Expected: /x/1_allreduce_cuda.py\n"
    verdict, why = sbs.original_verdict("Local (torchrun)\n", stderr, 1)
    assert verdict == "n/a"
    assert why.startswith("run_local.py exited 1 with no verdict: Error: no file for problem")


def test_a_harness_environment_failure_is_no_verdict():
    failed = trial(0, "harness_environment", harness_hint="no_gpu_visible: NVIDIA driver/GPU not visible")
    verdict, why = sbs.original_verdict(printed(False, [failed]), "", 1)
    assert (verdict, why) == (
        "n/a",
        "the harness's environment failed: no_gpu_visible: NVIDIA driver/GPU not visible",
    )


def judged(original, pkb, protections=()):
    row = sbs.Row(
        file="1_allreduce_cuda.py", problem=1, original=original, pkb=pkb, protections=list(protections)
    )
    sbs.judge(row)
    return row.agreement, row.explanation


def test_agreement_and_its_explanations():
    assert judged("pass", "pass") == ("agree", "")
    assert judged("fail", "fail") == ("agree", "")
    assert judged("fail", "timeout") == ("agree", "")
    assert judged("pass", "fail", ["aliasing", "mutation"]) == ("disagree", "protection: aliasing, mutation")
    assert judged("pass", "fail") == ("disagree", "unexplained")
    assert judged("fail", "pass") == ("disagree", "unexplained")
    assert judged("fail", "pass", ["aliasing"]) == ("disagree", "unexplained")  # names nothing pkb failed
    assert judged("n/a", "pass") == ("not compared", "no original verdict")
    assert judged("pass", "n/a") == ("not compared", "no pkb verdict")


def test_the_summary_counts_each_kind():
    rows = [sbs.Row(file=f"{i}.py", problem=i) for i in range(4)]
    for row, (agreement, explanation) in zip(
        rows,
        [
            ("agree", ""),
            ("disagree", "protection: aliasing"),
            ("disagree", "unexplained"),
            ("not compared", "x"),
        ],
        strict=True,
    ):
        row.agreement, row.explanation = agreement, explanation
    assert sbs.summary(rows) == (
        "4 files: 1 agree, 2 disagree (1 explained by a named protection, 1 unexplained), 1 not compared"
    )
