"""The command line: exit codes, one-sentence errors, tables and JSON.

Fast tier: `main` in-process for every input refused before a launch, and the commands that run no
candidate (problems, show, roofline). Integration tier: checks that launch ranks."""

import json
import os
import re
import subprocess
import sys

import pytest

from pkb_mcp.frontends.cli import main

from .conftest import CANDIDATES, ROOT


def run(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "pkb_mcp", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "99"], "problem 99 does not exist; see pkb problems"),
        (["check", "99", "x.py", "--device", "cpu"], "problem 99 does not exist"),
        (
            ["check", "12", str(CANDIDATES / "hangs.py"), "--world-size", "3", "--device", "cpu"],
            "cannot run at world size 3",
        ),
        (["check", "1", "missing.py", "--device", "cpu", "--world-size", "2"], "does not exist"),
        (
            [
                "check",
                "1",
                str(CANDIDATES / "hangs.py"),
                "--device",
                "cpu",
                "--world-size",
                "2",
                "--trials",
                "0",
            ],
            "trials must be between",
        ),
        (
            [
                "bench",
                "1",
                str(CANDIDATES / "hangs.py"),
                "--device",
                "cpu",
                "--world-size",
                "2",
                "--launches",
                "9",
            ],
            "launches must be between 1 and 8",
        ),
        (  # --jobs: the option's name before launches were called launches
            ["bench", "1", str(CANDIDATES / "hangs.py"), "--device", "cpu", "--jobs", "0"],
            "launches must be between 1 and 8",
        ),
        (["roofline", "1", "--time-ms", "-1"], "not positive"),
        (["show", "1", "--size", "huge"], "no size preset 'huge'"),
        (["show", "allreduce_typo"], "problem allreduce_typo does not exist; see pkb problems"),
        (["show", "12", "--world-size", "3"], "cannot run at world size 3"),
        (["roofline", "99"], "problem 99 does not exist"),
        (
            ["check", "1", str(CANDIDATES / "hangs.py"), "--device", "cpu", "--world-size", "0"],
            "world size must be between 1 and 64, not 0",
        ),
        (["bench", "99", str(CANDIDATES / "hangs.py"), "--device", "cpu"], "problem 99 does not exist"),
        (["bench", "1", "missing.py", "--device", "cpu", "--world-size", "2"], "does not exist"),
        (["profile", "1", "missing.py", "--device", "cpu", "--world-size", "2"], "does not exist"),
        (["compile", "missing.cu"], "does not exist"),
        (  # --attempts: each path is one attempt of the whole set, so no file may be in two
            [
                "eval",
                "--attempts",
                str(ROOT / "examples" / "original"),
                str(ROOT / "examples" / "original" / "001_allreduce_torch.py"),
            ],
            "is in attempt 1 and attempt 2",
        ),
        (["bogus"], "invalid choice"),
        # issue 51: an id of no problem is refused even where the file's name names one
        (["check", "999", "problems/001_allreduce.py", "--device", "cpu"], "problem 999 does not exist"),
        # a file that cannot run: refused before any launch, not a header and a table of empty rows
        (
            ["check", "1", str(CANDIDATES / "syntax_error.py"), "--device", "cpu", "--world-size", "2"],
            "the solution does not parse: syntax_error.py:2: invalid syntax",
        ),
        (
            ["bench", "1", str(CANDIDATES / "no_solution.py"), "--device", "cpu", "--world-size", "2"],
            "no_solution.py defines no solution()",
        ),
        (
            ["check", "12", str(CANDIDATES / "wrong_scale.py"), "--device", "cpu", "--world-size", "2"],
            "solution takes 1 parameter (x) here; expected solution(a_local, b_local)",
        ),
    ],
)
def test_bad_input_exits_2_with_one_sentence(capsys, args, message):
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own refusals: usage, then the error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err
    if args[0] != "bogus":
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cuda_without_gpu_is_an_environment_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["check", "1", str(CANDIDATES / "hangs.py"), "--device", "cuda", "--world-size", "2"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_problems_show_roofline_print_tables_and_json(capsys):
    assert main(["problems"]) == 0
    assert "allgather_gemm" in capsys.readouterr().out
    assert main(["problems", "--json", "--category", "primitive"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {p["id"] for p in listed} == {1, 2, 3, 4, 5, 6, 7, 8}
    assert main(["show", "12", "--world-size", "4"]) == 0
    text = capsys.readouterr().out
    assert "a_local" in text and "[256, 512]" in text
    assert main(["roofline", "1", "--world-size", "4", "--time-ms", "0.05", "--json"]) == 0
    roof = json.loads(capsys.readouterr().out)
    assert roof["floor_ms"] > 0 and roof["pct_of_floor"] == pytest.approx(100 * roof["floor_ms"] / 0.05)


def test_show_and_roofline_say_what_binds_and_the_exchange_s_share(capsys):
    """Issue 53: both say what binds the floor and the exchange's share of it, the same figures."""
    assert main(["roofline", "25", "--size", "large", "--json"]) == 0
    roof = json.loads(capsys.readouterr().out)
    assert main(["show", "25", "--size", "large", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["floor"]
    assert shown == {k: roof[k] for k in ("floor_ms", "bound", "nvlink_share", "latency_share")}
    assert shown["bound"] == "compute" and shown["latency_share"] == pytest.approx(5e-3 / shown["floor_ms"])
    for command in ("show", "roofline"):
        assert main([command, "25", "--size", "large"]) == 0
        assert (
            "binds: compute; the exchange: NVLink <0.01% + latency 0.23% of the floor"
            in capsys.readouterr().out
        )


def test_a_refusal_under_json_is_json(capsys):
    """Issue 51: with --json a refusal was plain text on stderr; it is {"error": sentence} on stdout."""
    cases = [
        ["show", "99", "--json"],
        ["check", "1", str(CANDIDATES / "syntax_error.py"), "--device", "cpu", "--world-size", "2", "--json"],
    ]
    for args in cases:
        assert main(args) == 2
        captured = capsys.readouterr()
        error = json.loads(captured.out)["error"]
        assert error.startswith(("problem 99 does not exist", "the solution does not parse")), error
        assert captured.err == ""
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal of an option
        main(["show", "1", "--json", "--no-such-option"])
    assert refused.value.code == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": "unrecognized arguments: --no-such-option; see pkb --help"}
    assert captured.err == ""


def test_an_eval_of_files_that_name_no_problem_runs_nothing_and_exits_2(capsys, tmp_path):
    """Issue 51: `pkb eval` of a file with no id in its name exited 0, having run nothing."""
    helper = tmp_path / "helper.py"
    helper.write_text("def solution(x):\n    return x\n")
    assert main(["eval", str(helper), "--device", "cpu", "--store", str(tmp_path / "e.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkb: no file of the batch can run, so nothing was run: helper.py: no problem id")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_check_through_a_real_subprocess_exit_codes():
    code, out, err = run(
        "check",
        "1",
        "problems/001_allreduce.py",
        "--device",
        "cpu",
        "--world-size",
        "2",
        "--trials",
        "2",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["verdict"] == "pass" and len(result["ranks"]) == 2
    sandbox = result["sandbox"]
    assert sandbox["backend"] in ("docker", "process") and sandbox["isolated"] == (
        sandbox["backend"] == "docker"
    )
    code, out, _ = run(
        "check",
        "1",
        "examples/wrong_allreduce_half.py",
        "--device",
        "cpu",
        "--world-size",
        "2",
        "--trials",
        "2",
    )
    # the first unreduced row; the column depends on the random inputs
    assert code == 1 and "first mismatch" in out and re.search(r"index \[512, \d+\]", out)


def test_logs_go_to_the_current_stderr_even_after_it_was_replaced(monkeypatch):
    """A logger made earlier must not keep writing to a stream that was swapped out (and maybe closed)."""
    import io

    from pkb_mcp import log

    logger = log.get("test")
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logger.warning("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logger.warning("two")
    assert '"event": "two"' in second.getvalue()


def test_json_output_parses_and_matches_the_tables(capsys):
    assert main(["show", "allreduce", "--world-size", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == 1 and shown["name"] == "allreduce" and shown["inputs"]
    assert main(["problems", "--json", "--text", "allgather_gemm"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert "allgather_gemm" in {p["name"] for p in found}
    assert main(["problems", "--category", "no-such-category"]) == 0
    assert "allreduce" not in capsys.readouterr().out
    assert main(["roofline", "allreduce", "--world-size", "2"]) == 0
    assert "floor" in capsys.readouterr().out


def test_show_prints_the_other_ranks_inputs_where_they_differ(capsys):
    """Issue 51: `pkb show 27` and `show 85` printed equal per-rank shapes (rank 0's, under "inputs
    per rank") where their text says the splits are uneven; and "1 rounds"."""
    assert main(["show", "85", "--world-size", "4"]) == 0
    text = capsys.readouterr().out
    assert "inputs of rank 0 at world size 4, size pkb:" in text
    assert "  local_shard: rank 1 [0], rank 2 [130], rank 3 [131]" in text
    assert main(["show", "27", "--world-size", "4"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("input_split_sizes"))
    splits = json.loads(row.split(None, 1)[1])
    assert sum(splits) == 1024 and len(set(splits)) > 1, row  # uneven, as the description says
    assert "  input_split_sizes: rank 1 [" in text and "  output_split_sizes: rank 1 [" in text
    assert "0 FLOP, 1 round\n" in text and "1 rounds" not in text
    assert main(["show", "1", "--world-size", "4"]) == 0
    assert "other ranks" not in capsys.readouterr().out  # every rank's inputs alike: no lines


def test_the_readme_names_every_example():
    """Issue 51: the README left out 001_allreduce_copy_engine.py and 049_moe_ep_experts_to_tokens.py."""
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "examples").glob("*.py")) if f"`{p.name}`" not in readme]
    assert missing == []


def test_each_extra_s_comment_is_its_own():
    """Issue 51: the [ray] extra carried the [plots] extra's comment."""
    lines = {line.split(" = ")[0]: line for line in (ROOT / "pyproject.toml").read_text().splitlines()}
    assert "pkb profile" in lines["plots"] and "matplotlib" in lines["plots"]
    assert "Ray" in lines["ray"] and "pkb profile" not in lines["ray"]


def test_a_reader_that_goes_away_ends_the_output_quietly():
    """`pkb show 1 | head`: the pipe's reader gone before pkb writes is a quiet exit 141, no traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before pkb writes a byte
    proc = subprocess.run(
        [sys.executable, "-m", "pkb_mcp", "show", "1"],
        stdout=write,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        timeout=300,
    )
    os.close(write)
    assert (proc.returncode, proc.stderr) == (141, b"")


def test_a_command_waits_for_the_header_a_build_of_it_asked_for_and_says_why(capsys):
    """A build asks for torch's precompiled header in a thread of its own (compile/headers.py); a
    command line that ended before it would end that launch, and its next run would ask again."""
    import threading
    import time

    from pkb_mcp.compile import headers

    made = threading.Event()

    def make() -> None:
        time.sleep(0.5)
        made.set()

    threading.Thread(target=make, name=headers.THREAD, daemon=True).start()
    assert main(["problems"]) == 0
    assert made.is_set(), "the command ended before the header"
    assert "finishing torch's precompiled header" in capsys.readouterr().err
    assert main(["problems"]) == 0 and "precompiled" not in capsys.readouterr().err, "none under way"
