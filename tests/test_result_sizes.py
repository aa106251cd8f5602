"""Every tool's structured result stays under 40,000 characters (about 10k tokens: Claude Code caps a
tool's output near 25k tokens, and a result is read beside the rest of an agent's context), for the
largest calls of each: the whole problem list, the largest reference of either variant, a roofline,
and failed checks, benchmarks and profiles on 8 ranks with every rank's traceback and log at their
caps, as the run tools, job_result and job_status return them. And list_problems reaches every
problem, on one page or through its pages."""

from __future__ import annotations

import json

import pytest
from mcp import Client

from pkb_mcp import problems, service
from pkb_mcp.frontends.server import ServerState, build_server
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobStore
from pkb_mcp.launches import RankOutcome
from pkb_mcp.models import (
    BenchResult,
    CheckResult,
    FloorPlacement,
    Mismatch,
    SandboxInfo,
    StaticReport,
    TimingStats,
)
from pkb_mcp.profiling.profile import Artifact, KernelTime, ProfileResult, RankProfile, SideProfile
from pkb_mcp.runs import run, static_report

pytestmark = pytest.mark.anyio
LIMIT = 40_000  # characters of the structured result as JSON
W = 8
SUITE = 87


@pytest.fixture
def anyio_backend():
    return "asyncio"


def chars(structured: object) -> int:
    return len(json.dumps(structured))


def _ranks() -> list:
    """Every rank failed, each with a long error, traceback and log (the caps of run.rank_result and
    the server's compacting apply), one wrong with its first mismatch."""
    ranks = [
        run.rank_result(
            RankOutcome(
                rank,
                "error",
                error="RuntimeError: " + "e" * 5_000,
                traceback="Traceback (most recent call last):\n" + "  t\n" * 20_000,
                log_tail="log line\n" * 10_000,
                stage="trial 5",
            )
        )
        for rank in range(W)
    ]
    ranks[1] = ranks[1].model_copy(
        update={
            "state": "wrong",
            "max_abs_error": 1.5,
            "rel_norm_error": 0.5,
            "mismatched": 10**6,
            "first_mismatch": Mismatch(output=3, index=[1, 2, 3, 4], expected="1.25", got="nan"),
        }
    )
    return ranks


def _common() -> dict:
    report = StaticReport(
        collectives=[f"collective_{i}" for i in range(30)],
        compute_ops=[f"op_{i}" for i in range(30)],
        multicast=False,
        suspicious=[f"line {i}: {'state kept across calls'} (name_{i})" for i in range(40)]
        + [f"... and {static_report.MAX_SUSPICIOUS} more"],
    )
    return {
        "problem_id": 32,
        "problem": "fused_moe_fwd_lora",
        "world_size": W,
        "size": "large",
        "device": "cuda",
        "wall_s": 812.5,
        "sandbox": SandboxInfo(backend="docker", isolated=True, note="x" * 200),
        "warnings": ["w" * 300] * 3,
        "notes": ["n" * 300] * 6,
        "static_report": report,
    }


def _timing() -> TimingStats:
    return TimingStats(
        median_ms=1.25,
        q1_ms=1.2,
        q3_ms=1.3,
        iqr_ms=0.1,
        min_ms=1.1,
        samples=400,
        stop_reason="the median's 95% interval is within 1% " * 3,
        warmup_calls=20,
        input_sets=8,
        clock="cuda events, max over ranks",
        wall_median_ms=1.3,
        launches=8,
        launch_spread=0.02,
        fresh_calls=50,
        fresh_median_ms=1.27,
        replay_advantage=1.01,
        replay_advantage_p=0.4,
        host_clock_median_ms=0.2,
        host_waited_calls=3,
    )


def _side() -> SideProfile:
    return SideProfile(
        calls=20,
        call_ms=1.2345,
        event_ms=1.2,
        comm_ms=0.5,
        compute_ms=0.6,
        overlap_ms=0.1,
        overlap_pct=20.0,
        gap_ms=0.05,
        launches=120.0,
        slowest_rank=3,
        others_wait_ms=0.2,
        slowest_does="s" * 200,
        ranks=[
            RankProfile(
                rank=r,
                call_ms=1.2345,
                comm_ms=0.5,
                compute_ms=0.6,
                overlap_ms=0.1,
                gap_ms=0.05,
                other_ms=0.01,
                wait_ms=0.2,
                launches=120.0,
                enqueue_ms=0.3,
            )
            for r in range(W)
        ],
        top=[KernelTime(name="k" * 80, category="compute", ms=0.1234, count=12.0) for _ in range(5)],
        missing=[f"rank {r}: " + "m" * 200 for r in range(W)],
    )


def _finished_jobs(store: JobStore) -> dict[str, str]:
    """A job of each kind, finished with its largest result, in the store: kind -> job id."""
    check = CheckResult(
        trials=100,
        verdict="fail",
        message="m" * 300,
        ranks=_ranks(),
        protections=["p" * 80] * 5,
        **_common(),
    )
    bench = BenchResult(
        verdict="fail",
        message="m" * 300,
        reference=_timing(),
        candidate=_timing(),
        speedup=1.5,
        speedup_low=1.4,
        speedup_high=1.6,
        roofline=FloorPlacement(
            floor_ms=0.8,
            bound="nvlink",
            nvlink_share=0.99,
            latency_share=0.01,
            time_ms=1.25,
            pct_of_floor=64.0,
            note="x" * 200,
        ),
        fresh_speedup=1.49,
        seen_inputs_advantage=1.0,
        within_noise=False,
        ranks=_ranks(),
        protections=["p" * 80] * 5,
        **_common(),
    )
    profile = ProfileResult(
        verdict="fail",
        message="m" * 300,
        reference=_side(),
        candidate=_side(),
        findings=["f" * 250] * 10,
        counters="c" * 300,
        trace=Artifact(path="/state/profiles/x/trace.json", bytes=10**8, events=200_000, cut_events=5),
        timeline=Artifact(path="/state/profiles/x/timeline.png", bytes=10**6),
        ranks=_ranks(),
        **_common(),
    )
    ids = {}
    for kind, result in (("check", check), ("bench", bench), ("profile", profile)):
        ids[kind] = f"{kind}00000000"
        store.create(ids[kind], kind, {"path": "/x.py", "problem": 32, "world_size": W})
        store.finish(ids[kind], "done", result=result.model_dump(mode="json"))
    store.create("failed00", "check", {"path": "/x.py"})
    store.finish("failed00", "failed", error="the reference of problem 32 failed on rank 3 " + "l" * 400)
    return ids


async def test_every_tool_s_largest_result_stays_under_10k_tokens(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    jobs = _finished_jobs(store)
    scheduler = Scheduler(store, gpus=0)
    tools = ServerState(scheduler, tmp_path / "sources")
    sizes: dict[str, int] = {}
    try:
        async with Client(build_server(scheduler, tmp_path / "sources")) as client:
            for detail in (False, True):
                listed = await client.call_tool("list_problems", {"detail": detail})
                sizes[f"list_problems detail={detail}"] = chars(listed.structured_content)
                assert len(listed.structured_content["problems"]) == SUITE
            for kind, job_id in jobs.items():
                record = scheduler.get(job_id)
                sizes[f"{kind} tool"] = chars(tools.result_of(record).structured_content)
                result = await client.call_tool("job_result", {"job_id": job_id})
                sizes[f"job_result {kind}"] = chars(result.structured_content)
            for job_id in [*jobs.values(), "failed00"]:
                status = await client.call_tool("job_status", {"job_id": job_id})
                sizes[f"job_status {job_id}"] = chars(status.structured_content)
            biggest = max(problems.suite().values(), key=lambda p: len(p.path.read_bytes()))
            reference = await client.call_tool("get_reference", {"problem": biggest.id, "world_size": W})
            sizes["get_reference biggest"] = chars(reference.structured_content)
            roof = await client.call_tool("roofline", {"problem": 32, "world_size": W, "time_ms": 1.0})
            sizes["roofline"] = chars(roof.structured_content)
    finally:
        scheduler.stop()
    over = {call: size for call, size in sizes.items() if size >= LIMIT}
    assert not over, over
    assert sizes["check tool"] > 8_000  # the ranks' details are there (compacted), not lost


def test_the_largest_references_of_either_variant_stay_under_10k_tokens():
    """get_reference carries the reference's source and its inputs: the longest files, at the most
    ranks each size preset allows."""
    for variant in problems.VARIANTS:
        longest = sorted(problems.suite(variant).values(), key=lambda p: -len(p.path.read_bytes()))[:6]
        for p in longest:
            for size in p.sizes:
                allowed = [w for w in (2, 4, 8) if not p.world_size_error(w, size)]
                detail = service.show_problem(p.id, allowed[-1], size, variant)
                assert chars(detail.model_dump(mode="json")) < LIMIT, (p.id, variant, size)


async def test_list_problems_pages_reach_every_problem_once(tmp_path):
    scheduler = Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=0)
    try:
        async with Client(build_server(scheduler, tmp_path / "sources")) as client:
            seen: list[int] = []
            offset: int | None = 0
            pages = 0
            while offset is not None:
                page = await client.call_tool("list_problems", {"offset": offset, "limit": 20})
                rows = page.structured_content["problems"]
                assert page.structured_content["total"] == SUITE and len(rows) <= 20
                assert set(rows[0]) == {"id", "name", "category", "summary"}  # short rows by default
                seen += [row["id"] for row in rows]
                offset = page.structured_content.get("next_offset")
                pages += 1
            assert pages == 5 and seen == sorted(problems.suite()) and len(seen) == SUITE
            assert (
                "the next page starts at offset 20"
                in (await client.call_tool("list_problems", {"limit": 20})).content[0].text
            )
            whole = await client.call_tool("list_problems", {})
            assert "next_offset" not in whole.structured_content
            assert [row["id"] for row in whole.structured_content["problems"]] == seen
            detailed = await client.call_tool("list_problems", {"category": "primitive", "detail": True})
            rows = detailed.structured_content["problems"]
            assert [row["id"] for row in rows] == list(range(1, 9))
            assert rows[0]["world_sizes"] == "any world size >= 2" and rows[0]["dtype"] == "bfloat16"
            found = await client.call_tool("list_problems", {"text": "sinkhorn"})
            assert [row["id"] for row in found.structured_content["problems"]] == [80]
            beyond = await client.call_tool("list_problems", {"offset": 500})
            assert beyond.structured_content["problems"] == [] and "87 match" in beyond.content[0].text
            refused = await client.call_tool("list_problems", {"limit": 0})
            assert refused.is_error and "limit" in refused.content[0].text
    finally:
        scheduler.stop()


def test_a_page_outside_the_list_is_refused_by_the_service_in_one_sentence():
    from pkb_mcp.errors import UserError

    with pytest.raises(UserError, match="offset -1 is negative; the first problem is at offset 0"):
        service.problem_page(offset=-1)
    with pytest.raises(UserError, match="limit must be between 1 and 100, not 101"):
        service.problem_page(limit=101)
    page = service.problem_page(category="primitive", offset=6, limit=5)
    assert [p.id for p in page.problems] == [7, 8] and page.total == 8 and page.next_offset is None
