"""Every headline of a benchmark is true on its own (issue 51): a speedup within noise says so first,
in the result's message (the CLI's verdict line, an MCP tool's text, a task's status) and in the
job's last message, the figure after it as measured and not credited. Synthetic timings: no launch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pkb_mcp import problems, render
from pkb_mcp.frontends.server import ServerState
from pkb_mcp.frontends.tasks import TasksExtension
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.models import BenchResult, SandboxInfo, TimingStats
from pkb_mcp.runs import benchmark


def timing(median: float, q1: float, q3: float) -> TimingStats:
    return TimingStats(
        median_ms=median,
        q1_ms=q1,
        q3_ms=q3,
        iqr_ms=q3 - q1,
        min_ms=q1,
        samples=40,
        stop_reason="budget",
        warmup_calls=3,
        input_sets=4,
        clock="perf_counter",
        wall_median_ms=median,
    )


def credited(reference: TimingStats, candidate: TimingStats, device: str = "cpu") -> BenchResult:
    """A benchmark's result as bench() makes it from two sides' timings that passed judging."""
    run = SimpleNamespace(problem=problems.resolve(1), world_size=2, size="pkb", device=device, warnings=[])
    fields: dict[str, Any] = {"reference": reference}
    verdict, message = benchmark._credit(run, reference, candidate, 1, fields)[:2]  # type: ignore[arg-type]
    return BenchResult(
        problem_id=1,
        problem="allreduce",
        world_size=2,
        size="pkb",
        device=device,
        verdict=verdict,
        message=message,
        candidate=candidate,
        wall_s=1.0,
        sandbox=SandboxInfo(backend="process", isolated=False),
        **fields,
    )


# identical code on a shared CPU: 1.366x measured, its quartile range across 1.00x
NOISY = (timing(1.366, 0.8, 2.0), timing(1.0, 0.7, 1.6))


def test_a_speedup_within_noise_says_so_first_everywhere():
    r = credited(*NOISY)
    assert r.verdict == "pass" and r.within_noise
    assert r.message.startswith("within noise of the reference (1.366x measured, quartile range "), r.message
    assert "not credited)" in r.message and "no evidence of a difference" in r.message
    text = render.bench(r)
    assert "PASS: within noise of the reference (1.366x measured" in text
    assert "PASS: 1.366x" not in text and "speedup 1.366x" not in text
    assert "speedup: within noise of the reference (1.366x measured" in text
    assert render.bench_headline(r).startswith("PASS: within noise of the reference (1.366x measured")
    assert text.splitlines()[-1].startswith(render.bench_headline(r)), "the CLI and the job agree"


def test_a_speedup_beyond_noise_leads_with_its_figure():
    r = credited(timing(2.0, 1.9, 2.1), timing(1.0, 0.95, 1.05), device="cpu")
    assert not r.within_noise and r.verdict == "pass"
    assert r.message.startswith("2.000x the reference (quartile range 1.810-2.211); candidate 1 ms"), (
        r.message
    )
    assert render.bench_headline(r) == "PASS: 2.000x the reference (quartile range 1.810-2.211)"


def test_a_gpu_speedup_within_noise_says_so_first():
    r = credited(timing(1.02, 1.019, 1.021), timing(1.0, 0.999, 1.001), device="cuda")
    assert r.within_noise and r.verdict == "pass", r.message
    assert r.message.startswith("within noise of the reference (1.020x measured"), r.message


def test_the_job_s_text_and_the_task_s_status_lead_with_within_noise(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    r = credited(*NOISY)
    store.create("j1", "bench", {"path": "x.py"})
    store.progress("j1", 3, 3, render.bench_headline(r))  # as bench() ends (test_end_to_end.py runs it)
    store.finish("j1", "done", result=r.model_dump(mode="json"))
    scheduler = Scheduler(store, gpus=0)  # after: a queued job would be run
    try:
        tools = ServerState(scheduler, tmp_path / "sources", roots=[])
        record = scheduler.get("j1")
        out = tools.output(record)
        assert out.message.startswith("PASS: within noise of the reference"), out.message
        assert "PASS: within noise of the reference (1.366x measured" in tools.text(out, record.kind)
        task = TasksExtension(tools).task(record)
        assert task["statusMessage"].startswith("within noise of the reference (1.366x"), task
    finally:
        scheduler.stop()


def test_a_pkb_eval_progress_line_says_not_credited_before_the_figure():
    from pkb_mcp.evaluation.batch import _Batch
    from pkb_mcp.evaluation.records import FileResult

    def line(**fields: Any) -> str:
        result = FileResult(file="a.py", sha256="0", outcome="pass", correct=True, speedup=1.366, **fields)
        return _Batch._what(SimpleNamespace(stage="done", result=result))  # type: ignore[arg-type]

    assert line(credited=False) == "pass, not credited (1.366x measured)"
    assert line(credited=True) == "pass, 1.366x"
