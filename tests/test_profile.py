"""The profile tool: trace reading (forged and oversized files refused), the figures on synthetic
traces, the merged trace, the timeline, and end to end on CPU ranks (gloo) through the service, the
MCP server and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from pkb_mcp.models import RunRequest
from pkb_mcp.profiling import profile, timeline, traces

from .conftest import CANDIDATES, ROOT

REFERENCE_1 = ROOT / "problems" / "001_allreduce.py"
MAIN, GPU = 100, 0  # the calling thread's id; the device's pid in a kineto trace


# ---------------------------------------------------------------- synthetic traces


def x(name, cat, ts, dur, pid=1, tid=MAIN, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def gpu_rank(rank, nccl_start=30.0):
    """One call: a GEMM on stream 7 at 10-50 us, an NCCL kernel on stream 20 from `nccl_start` for
    40 us, both launched inside the call's range; an alignment all-reduce before it (not the call's).
    Like a real kineto trace on GPUs, the device rows carry the annotations again (`gpu_user_annotation`):
    those are not calls."""
    return {
        "traceEvents": [
            x("ncclDevKernel_AllReduce_Sum_f32", "kernel", 0, 5, GPU, 20, correlation=1, stream=20),
            x("cudaLaunchKernel", "cuda_runtime", -20, 2, correlation=1),
            x(f"{traces.CALL_LABEL}1", "user_annotation", 1, 8),
            x("cudaLaunchKernel", "cuda_runtime", 2, 1, correlation=2),
            x("cudaLaunchKernel", "cuda_runtime", 4, 1, correlation=3),
            x("sm90_xmma_gemm_bf16", "kernel", 10, 40, GPU, 7, correlation=2, stream=7),
            x("ncclDevKernel_AllGather_RING_LL", "kernel", nccl_start, 40, GPU, 20, correlation=3, stream=20),
            x(f"{traces.CALL_LABEL}1", "gpu_user_annotation", 10, 40, GPU, 7),
            x("nccl:_all_gather_base", "gpu_user_annotation", nccl_start, 40, GPU, 20),
        ]
    }


def test_interval_union_and_intersection():
    a = traces.union([(0, 10), (5, 20), (30, 40), (50, 50)])
    assert a == [(0, 20), (30, 40)] and traces.length(a) == 30
    assert traces.intersect(a, traces.union([(15, 35)])) == [(15, 20), (30, 35)]


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", "comm"),
        ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<...>", "kernel", "comm"),
        ("Memcpy PtoP (Device -> Device)", "gpu_memcpy", "comm"),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "comm"),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", "other"),
        ("Memset (Device)", "gpu_memset", "other"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "compute"),
        ("gloo:all_reduce", "user_annotation", "comm"),
        ("c10d::allreduce_", "cpu_op", "comm"),
        ("aten::mm", "cpu_op", "compute"),
    ],
)
def test_categories(name, cat, expected):
    assert traces.category(traces.Event(name, cat, 0.0, 1.0, 1, 1)) == expected


def test_gpu_call_figures_from_correlated_launches():
    trace = traces.parse_trace(gpu_rank(0), 0)
    (call,) = traces.call_ranges(trace)
    f = traces.call_figures(trace, call, on_gpu=True)
    # the alignment all-reduce before the call is not the call's: its launch is outside the range
    assert f.window == (10, 70) and f.launches == 2
    assert (f.comm_us, f.compute_us, f.overlap_us, f.gap_us) == (40, 40, 20, 0)
    assert {b.row for b in f.bars} == {"rank 0 stream 7", "rank 0 stream 20"}


def test_waits_and_the_slowest_rank():
    side = traces.analyze([traces.parse_trace(gpu_rank(0), 0), traces.parse_trace(gpu_rank(1, 45.0), 1)])
    (call,) = side.calls
    assert [c.wait_us for c in call] == [15.0, 0.0]  # rank 0's NCCL kernel waits for rank 1's to start
    rank, wait_ms, _ = traces.slowest_rank(side)
    assert rank == 1 and wait_ms == pytest.approx(0.015)
    result = profile.side_profile(side)
    assert result.overlap_pct == pytest.approx(100 * 12.5 / 40)  # rank 1: 5 us of overlap, rank 0: 20
    assert {(t.name, t.category, t.ms, t.count) for t in result.top} == {
        ("sm90_xmma_gemm_bf16", "compute", 0.04, 1.0),
        ("ncclDevKernel_AllGather_RING_LL", "comm", 0.04, 1.0),
    }


# ---------------------------------------------------------------- untrusted files


def write_rank(folder, rank, trace, info=None):
    folder.mkdir(exist_ok=True)
    (folder / f"r{rank}.trace.json").write_text(trace if isinstance(trace, str) else json.dumps(trace))
    (folder / f"r{rank}.info.json").write_text(json.dumps(info or {"event_ms": [0.1]}))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not json", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "JSON objects and arrays"),
        ("[" * 5000 + "]" * 5000, "not valid JSON"),  # nesting deeper than the parser's recursion limit
        (json.dumps({"traceEvents": "nope"}), "no traceEvents list"),
        (json.dumps([1, 2, 3]), "no traceEvents list"),
    ],
    ids=["not-json", "too-many-containers", "too-deep", "wrong-type", "not-an-object"],
)
def test_forged_traces_are_refused_with_a_reason(tmp_path, monkeypatch, content, why):
    monkeypatch.setattr(traces, "MAX_CONTAINERS", 50_000)
    write_rank(tmp_path / "profile", 0, content)
    got = traces.read_rank(tmp_path / "profile", 0)
    assert got.error is not None and why in got.error and not got.events


def test_oversized_and_linked_files_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "TRACE_CAP", 1000)
    write_rank(tmp_path / "profile", 0, {"traceEvents": [x("a", "cpu_op", 0, 1)] * 100})
    assert "over the 1000-byte limit" in (traces.read_rank(tmp_path / "profile", 0).error or "")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(gpu_rank(0)))
    link = tmp_path / "profile" / "r1.trace.json"
    link.symlink_to(secret)
    (tmp_path / "profile" / "r1.info.json").write_text("{}")
    assert "missing" in (traces.read_rank(tmp_path / "profile", 1).error or "")


def test_malformed_events_are_dropped_and_names_cut():
    events = [
        x("ok", "cpu_op", 0, 1),
        x("nan", "cpu_op", float("nan"), 1),
        x("negative", "cpu_op", 0, -1),
        x("huge", "cpu_op", 0, 1e13),
        {"ph": "X", "name": 5, "cat": "cpu_op", "ts": 0, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "name": "pid", "cat": "cpu_op", "ts": 0, "dur": 1, "pid": {"a": 1}, "tid": 1},
        x("n" * 10_000, "cpu_op", 0, 1, correlation="12", stream=1 << 70),
        "not an event",
    ]
    got = traces.parse_trace({"traceEvents": events}, 0)
    assert [e.name[:2] for e in got.events] == ["ok", "nn"]
    assert len(got.events[1].name) == traces.NAME_CHARS and got.events[1].corr is None
    assert got.events[1].stream is None


def test_a_missing_rank_is_reported_not_fatal(tmp_path):
    write_rank(tmp_path / "profile", 0, gpu_rank(0))
    write_rank(tmp_path / "profile", 1, "{broken")
    side = traces.analyze(traces.read_launch(tmp_path, 2))
    assert side.ranks == [0] and "not valid JSON" in side.missing[1]
    assert profile.side_profile(side).missing == [f"rank 1: {side.missing[1]}"]


def test_merged_trace_has_one_process_per_side_and_rank_and_respects_its_cap():
    ranks = [traces.parse_trace(gpu_rank(r), r) for r in range(2)]
    data, written, cut = traces.merged_trace({"candidate": ranks, "reference": ranks})
    merged = json.loads(data)
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"{side} rank {r}" for side in ("candidate", "reference") for r in range(2)}
    assert written == 4 * 9 and cut == 0
    small, written, cut = traces.merged_trace({"candidate": ranks}, cap=(64 << 10) + 600)
    assert cut > 0 and written + cut == 18 and json.loads(small)["otherData"]["cut"] == cut


def test_timeline_png_or_the_reason_there_is_none(tmp_path, monkeypatch):
    bars = [traces.Bar("rank 0 stream 7", 0, 40, "compute"), traces.Bar("rank 0 stream 20", 20, 60, "comm")]
    png = tmp_path / "t.png"
    assert timeline.draw({"candidate": (bars, "call 1 of 1")}, png) is None
    assert png.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    why = timeline.draw({"candidate": (bars, "")}, tmp_path / "u.png")
    assert why is not None and "matplotlib is not installed" in why


def test_a_cluster_node_s_artifacts_land_under_the_server_s_folder_or_are_left_out(tmp_path, monkeypatch):
    """pkb_mcp/jobs/cluster.py: the node sends its trace and timeline as bytes; the server writes them under
    its own folder and file names, and leaves out (saying why) what is missing, oversized or forged."""
    node = tmp_path / "node"
    (node / "p").mkdir(parents=True)
    (node / "p" / "trace.json").write_text('{"traceEvents": []}')
    (node / "p" / "timeline.png").write_bytes(profile.PNG_SIGNATURE + b"drawn")
    result = {
        "trace": {"path": str(node / "p" / "trace.json"), "bytes": 19, "events": 0, "cut_events": 0},
        "timeline": {"path": str(node / "p" / "timeline.png"), "bytes": 13},
        "warnings": [],
    }
    packed = profile.pack_artifacts(result, node)
    assert packed == {"trace": b'{"traceEvents": []}', "timeline": profile.PNG_SIGNATURE + b"drawn"}
    server = tmp_path / "server"
    landed = profile.land_artifacts(result, packed, server)
    for name, file in profile.ARTIFACT_FILES.items():
        path = Path(landed[name]["path"])
        assert path.parent.parent == server and path.name == file and path.read_bytes() == packed[name]
        assert landed[name]["bytes"] == len(packed[name])
    assert landed["warnings"] == [] and result["trace"]["path"].startswith(str(node)), "a copy"

    outside = {**result, "trace": {**result["trace"], "path": "/etc/hostname"}}
    assert profile.pack_artifacts(outside, node)["trace"] == "the node wrote it outside the job's folder"
    monkeypatch.setitem(profile.ARTIFACT_CAPS, "timeline", 8)
    assert "over the limit" in str(profile.pack_artifacts(result, node)["timeline"])
    refused = profile.land_artifacts(result, {"trace": b"\xff{", "timeline": b"GIF89a"}, server)
    missing = profile.land_artifacts(result, None, server)
    assert refused["trace"] is None and refused["timeline"] is None and missing["trace"] is None
    assert ["not UTF-8" in refused["warnings"][0], "not a PNG" in refused["warnings"][1]] == [True, True]
    assert "no bytes came" in missing["warnings"][0]
    assert len(list(server.iterdir())) == 1, "a folder only for what was written"


def test_calls_out_of_range_is_one_sentence(capsys):
    from pkb_mcp.frontends.cli import main

    args = ["profile", "1", str(REFERENCE_1), "--device", "cpu", "--world-size", "2", "--calls", "0"]
    assert main(args) == 2
    assert "calls must be between 1 and 20" in capsys.readouterr().err


def test_a_profile_has_the_node_to_itself_and_runs_the_profile_verb(tmp_path):
    from pkb_mcp import service
    from pkb_mcp.jobs import scheduler as sched
    from pkb_mcp.jobs.store import JobRecord, JobStore

    s = sched.Scheduler(JobStore(tmp_path / "jobs.sqlite"), gpus=4)
    try:
        params = {"path": "/x.py", "world_size": 2, "device": "cuda"}
        record = JobRecord(id="p", kind="profile", state="queued", created=0.0, params=params)
        assert s._needs(record) == ("gpu", 4)  # timed like a benchmark: every GPU of the node
    finally:
        s.stop()
    assert service.VERBS["profile"].run is profile.profile


# ---------------------------------------------------------------- end to end on CPU ranks


@pytest.mark.integration
def test_reference_all_reduce_is_communication(tmp_path):
    r = profile.profile(
        RunRequest(problem=1, path=REFERENCE_1, world_size=2, device="cpu", out_dir=tmp_path, timeout_s=120)
    )
    assert r.verdict == "ok", r.message
    for side in (r.reference, r.candidate):
        assert side is not None and side.calls == 3 and len(side.ranks) == 2
        assert side.comm_ms > 0 and all(k.comm_ms > 0 for k in side.ranks)
        assert ("gloo:all_reduce", "comm") in {(k.name, k.category) for k in side.top}
    # no counters on CPU: the result says which method was used and why (docs/nvlink-counters.md)
    assert r.method == "names"
    assert r.counters == "NVLink bytes not measured, communication by kernel name: the launch ran on CPU"
    for side in (r.reference, r.candidate):
        assert side.nvlink is not None and side.nvlink.method == "names" and side.nvlink.ranks == []
    assert r.trace is not None and r.timeline is not None
    merged = json.loads((tmp_path / "trace.json").read_text())
    processes = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert sorted(processes.values()) == [f"{s} rank {k}" for s in ("candidate", "reference") for k in (0, 1)]
    assert {e["pid"] for e in merged["traceEvents"] if e["ph"] == "X"} == set(processes)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration
def test_compute_between_collectives_shows_as_compute_and_overlap(tmp_path):
    cand = CANDIDATES / "computes_between_collectives.py"
    r = profile.profile(
        RunRequest(problem=1, path=cand, world_size=2, device="cpu", out_dir=tmp_path, timeout_s=180)
    )
    assert r.verdict == "ok", r.message
    assert r.candidate is not None and r.reference is not None
    # its matmuls are compute only it has (a ratio of CPU times fails on a loaded machine)

    def matmuls(side):
        return [k for k in side.top if k.category == "compute" and ("mm" in k.name or "matmul" in k.name)]

    assert matmuls(r.candidate) and not matmuls(r.reference), (r.candidate.top, r.reference.top)
    assert r.candidate.compute_ms > r.reference.compute_ms
    assert r.candidate.overlap_ms > 0 and r.reference.overlap_ms == 0
    assert any(k.category == "compute" and k.name.startswith("aten::") for k in r.candidate.top)
    assert any("overlapped with compute" in f for f in r.findings)


@pytest.mark.integration
def test_profile_through_the_mcp_server(tmp_path):
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from pkb_mcp.frontends.server import build_server
    from pkb_mcp.jobs.scheduler import Scheduler
    from pkb_mcp.jobs.store import JobStore

    async def go():
        scheduler = Scheduler(JobStore(tmp_path / "state" / "jobs.sqlite"), gpus=0)
        try:
            async with Client(build_server(scheduler, tmp_path / "state" / "sources")) as c:
                args = {"problem": 1, "path": str(REFERENCE_1), "world_size": 2, "device": "cpu"}
                got = await c.call_tool("profile", args)
                assert not got.is_error
                out = got.structured_content
                assert out["state"] == "done" and out["result"]["verdict"] == "ok"
                assert out["result"]["candidate"]["comm_ms"] > 0
                text = "\n".join(b.text for b in got.content if b.type == "text")
                job = out["job_id"]
                assert f"pkb://jobs/{job}/trace" in text and "gloo:all_reduce" in text
                assert len(json.dumps(out)) < 8000, "compact for clients that cap output"
                trace = await c.read_resource(f"pkb://jobs/{job}/trace")
                assert json.loads(trace.contents[0].text)["traceEvents"]
                png = await c.read_resource(f"pkb://jobs/{job}/timeline")
                assert png.contents[0].mime_type == "image/png" and png.contents[0].blob
                kinds = await c.call_tool("job_result", {"job_id": job})
                assert kinds.structured_content["kind"] == "profile"
                with pytest.raises(MCPError, match="job feedface has no trace"):
                    await c.read_resource("pkb://jobs/feedface/trace")
        finally:
            scheduler.stop()

    anyio.run(go)


@pytest.mark.integration
def test_cli_profile_json_and_files(tmp_path):
    proc = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "pkb_mcp",
                "profile",
                "1",
                str(REFERENCE_1),
                "--device",
                "cpu",
            ),
            *("--world-size", "2", "--calls", "2", "--json", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["candidate"]["calls"] == 2 and result["trace"]["path"] == str(tmp_path / "trace.json")
    assert result["method"] == "names" and result["candidate"]["nvlink"]["why"] == "the launch ran on CPU"
    assert (tmp_path / "trace.json").is_file() and (tmp_path / "timeline.png").is_file()


# ---------------------------------------------------------------- GPUs (docs/gpu-results.md)


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
def test_gpu_overlap_of_example_012_and_none_in_the_reference(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    example = ROOT / "examples" / "012_allgather_gemm_overlap.py"
    r = profile.profile(
        RunRequest(problem=12, path=example, world_size=2, size="large", device="cuda", out_dir=tmp_path)
    )
    assert r.verdict == "ok" and r.reference is not None and r.candidate is not None, r.message
    assert any(k.category == "comm" and "nccl" in k.name.lower() for k in r.reference.top)
    assert r.reference.overlap_pct is not None and r.reference.overlap_pct < 5
    assert r.candidate.overlap_ms > 0
    assert r.reference.event_ms is not None and r.reference.call_ms > 0
    assert r.method in ("ncu", "nvml", "names") and r.counters.startswith("NVLink bytes ")


@pytest.mark.gpu
def test_gpu_symmetric_memory_kernels_are_communication(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    example = ROOT / "examples" / "001_allreduce_symm_mem.py"
    r = profile.profile(RunRequest(problem=1, path=example, world_size=2, device="cuda", out_dir=tmp_path))
    assert r.verdict == "ok" and r.candidate is not None, r.message
    assert r.candidate.comm_ms > 0 and r.candidate.launches >= 1


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("example", "mechanism"),
    [("001_allreduce_cuda_oneshot.py", "sm"), ("001_allreduce_copy_engine.py", "copy_engine")],
)
def test_gpu_nvlink_bytes_and_mechanism_of_example_001(tmp_path, example, mechanism):
    """Issue 34's evidence (docs/nvlink-counters.md): each side's bytes within 10% of the traffic model,
    and, where ncu counted, the mechanism of each side. Not yet run on a GPU when written."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    request = RunRequest(
        problem=1,
        path=ROOT / "examples" / example,
        world_size=2,
        size="large",
        device="cuda",
        sandbox="process",
        out_dir=tmp_path,
    )
    r = profile.profile(request)
    assert r.verdict == "ok" and r.candidate is not None and r.reference is not None, r.message
    assert r.method in ("ncu", "nvml"), r.counters
    for side, expected in ((r.candidate, mechanism), (r.reference, "nccl")):
        n = side.nvlink
        assert n is not None and n.floor_bytes and len(n.ranks) == 2, n
        for k in n.ranks:
            assert abs(max(k.tx_bytes, k.rx_bytes) / n.floor_bytes - 1) < 0.10, (k, n.floor_bytes)
        if n.method == "ncu":
            assert expected in {k.mechanism for k in n.kernels}, n.kernels
