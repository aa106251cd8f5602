"""NVLink bytes in a profile (docs/nvlink-counters.md), on CPU: the ncu CSV read from hand-written
fixtures in its documented layouts (tests/ncu/, each saying so in its header) and refused when forged or
oversized; the NVML reader over a fake library; the counter launch's plan and each rank's ncu command;
attribution, mechanism, bandwidth, the measured categories and the findings on synthetic traces; the
fallback from ncu to nvml to names with the reason; and a launch whose ranks start under a stand-in
for ncu."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from harness import counters
from harness import profile as harness_profile
from harness.contracts import CounterPlan
from pkb_mcp.models import Ceilings
from pkb_mcp.profiling import ncu_csv, nvlink, traces

FIXTURES = Path(__file__).resolve().parent / "ncu"
LIMITS = Ceilings(
    nvlink_gbps=400.0, hbm_gbps=4000.0, tflops={"float32": 60.0}, round_latency_us=5.0, source="test ceilings"
)
MIB = 1 << 20
ONESHOT = "void oneshot_sum_bf16(Peers, int, uint4 *, long long)"
BARRIER = "void c10d::symmetric_memory::barrier_kernel(unsigned int **, int, int, int, unsigned long)"
FILL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>"
    "(int, at::native::FillFunctor<float>, std::array<char *, 1>)"
)
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COPY = "Memcpy DtoD (Device -> Device)"


# ---------------------------------------------------------------- the ncu CSV


def test_raw_page_kernels_in_order_with_thousands_separators_and_passes():
    got = ncu_csv.read(FIXTURES / "raw_page.csv", nvlink.NCU_METRICS)
    assert [k.index for k in got.kernels] == [0, 1, 2]
    assert [k.name for k in got.kernels] == [ONESHOT, BARRIER, FILL[: traces.NAME_CHARS]]
    one = got.kernels[0].metrics
    assert one[nvlink.PEER_SECTORS] == 65536 and one[nvlink.RX_USER] == 2 * MIB
    assert one[nvlink.DURATION] == 41216  # nanoseconds
    assert got.passes == 1 and got.messages == ["==WARNING== Note: Running with uncontrolled GPU clocks."]


def test_details_page_converts_units_and_ignores_unasked_metrics():
    got = ncu_csv.read(FIXTURES / "details_page.csv", nvlink.NCU_METRICS)
    (kernel,) = got.kernels
    assert kernel.name == NCCL_KERNEL and got.passes == 2
    assert kernel.metrics == {
        nvlink.DURATION: pytest.approx(52480.0),
        nvlink.RX_USER: pytest.approx(2_097_152.0),
        nvlink.TX_USER: pytest.approx(2_097_152.0),
        nvlink.PEER_SECTORS: 65536.0,
    }


def test_a_log_without_kernels_says_what_ncu_said():
    with pytest.raises(ncu_csv.NcuError, match="LibraryNotLoaded"):
        ncu_csv.read(FIXTURES / "failed_to_start.csv", nvlink.NCU_METRICS)


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        ("1,234", "byte", 1234.0),
        ("2.5", "Kbyte", 2500.0),
        ("3", "usecond", 3000.0),
        ("-1", "byte", None),
        ("nan", "byte", None),
        ("inf", "byte", None),
        ("n/a", "byte", None),
        ("1", "furlong", None),
        ("9" * 50, "byte", None),
    ],
)
def test_numbers_are_strict(value, unit, expected):
    assert ncu_csv.number(value, unit) == expected


def test_forged_logs_are_refused_or_trimmed(tmp_path, monkeypatch):
    header = '"ID","Kernel Name","nvlrx__bytes.sum"\n"","","byte"\n'
    bad_rows = '"0","k","5"\n"1","short row"\n"x","not an id","7"\n"2","m","-3"\n'
    got = ncu_csv.parse(header + bad_rows, nvlink.NCU_METRICS)
    assert [(k.index, k.name, k.metrics) for k in got.kernels] == [(0, "k", {nvlink.RX: 5.0}), (2, "m", {})]
    with pytest.raises(ncu_csv.NcuError, match="over"):
        ncu_csv.parse("x" * (ncu_csv.MAX_LINE + 1), [])
    monkeypatch.setattr(ncu_csv, "MAX_ROWS", 3)
    with pytest.raises(ncu_csv.NcuError, match="more than 3 rows"):
        ncu_csv.parse(header + bad_rows, [])
    with pytest.raises(ncu_csv.NcuError, match="no CSV"):
        ncu_csv.parse('"a","b"\n"1","2"\n', [])
    big = tmp_path / "r0.ncu.csv"
    big.write_text(header * 10)
    with pytest.raises(traces.TraceError, match="over the 100-byte limit"):
        ncu_csv.read(big, [], cap=100)
    link = tmp_path / "r1.ncu.csv"
    link.symlink_to(FIXTURES / "raw_page.csv")
    with pytest.raises(traces.TraceError, match="missing"):
        ncu_csv.read(link, [])


# ---------------------------------------------------------------- the counter launch's plan and command


def test_no_counter_launch_without_a_gpu_a_process_sandbox_or_ncu(monkeypatch):
    assert nvlink.plan("cpu", isolated=False) == (None, "the launch ran on CPU")
    plan, why = nvlink.plan("cuda", isolated=True)
    assert plan is None and "Docker sandbox" in why
    monkeypatch.setattr(counters, "find_ncu", lambda: None)
    plan, why = nvlink.plan("cuda", isolated=False)
    assert plan is None and "not found" in why


def test_a_counter_plan_and_each_rank_s_ncu_command(monkeypatch, tmp_path):
    monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/nvidia/nsight-compute/2025.3.1/ncu")
    monkeypatch.setattr(counters, "ncu_unavailable", lambda device, ncu: None)
    monkeypatch.setenv("PKB_NCU_METRICS", "nvlrx__bytes.sum, dram__bytes.sum")
    plan, why = nvlink.plan("cuda", isolated=False)
    assert why == "" and plan is not None
    assert plan["metrics"] == ["nvlrx__bytes.sum", "dram__bytes.sum"]
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))  # the sandbox's short TMPDIR (sandbox/process.py)
    argv0, env0 = counters.ncu_wrapper(plan, 0, tmp_path)
    _, env1 = counters.ncu_wrapper(plan, 1, tmp_path)
    assert env1["TMPDIR"] == str(tmp_path / "t" / "ncu-r1")
    assert argv0[0] == plan["ncu"]
    pairs = dict(zip(argv0[1::2], argv0[2::2], strict=False))
    assert pairs["--clock-control"] == "none" and pairs["--profile-from-start"] == "off"
    assert pairs["--metrics"] == "nvlrx__bytes.sum,dram__bytes.sum"
    assert argv0[argv0.index("--log-file") + 1] == str(tmp_path / "profile" / "r0.ncu.csv")
    assert env0["TMPDIR"] != env1["TMPDIR"], "each rank takes its own ncu lock file"
    assert Path(env1["TMPDIR"]).is_dir()
    # ... and the workers take the launch's back: symmetric memory finds a peer's socket under it
    assert env0[counters.WORKER_TMPDIR] == env1[counters.WORKER_TMPDIR] == str(tmp_path / "t")
    monkeypatch.setenv("PKB_NCU_METRICS", "bad metric; rm -rf /")
    with pytest.raises(ValueError, match="PKB_NCU_METRICS"):
        nvlink.plan("cuda", isolated=False)


def test_find_ncu_and_why_it_cannot_run(tmp_path):
    tool = tmp_path / "ncu"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert counters.find_ncu({"PKB_NCU": str(tool)}) == str(tool)
    assert counters.find_ncu({"PKB_NCU": str(tmp_path / "missing")}) is None
    assert counters.find_ncu({"PATH": str(tmp_path)}) == str(tool)
    assert counters.ncu_unavailable("cpu", str(tool)) == "the launch ran on CPU"
    assert "not found" in (counters.ncu_unavailable("cuda", None) or "")


# ---------------------------------------------------------------- NVML


class FakeNvml:
    """libnvidia-ml as ctypes would call it: cumulative KiB that grow by `step` per read."""

    def __init__(self, step=(2048, 1024), value_type=3, field_return=0):
        self.kib = [0, 0]
        self.step, self.value_type, self.field_return = step, value_type, field_return

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, handle):
        self.bus = bus
        return 0

    def nvmlDeviceGetFieldValues(self, handle, count, values):
        self.kib = [self.kib[0] + self.step[0], self.kib[1] + self.step[1]]
        for v, kib in zip(values, self.kib, strict=True):
            v.valueType, v.nvmlReturn, v.value = self.value_type, self.field_return, kib
        return 0


def test_nvml_field_layout_and_values(monkeypatch):
    assert ctypes.sizeof(counters.FieldValue) == 40  # nvmlFieldValue_t: value at offset 32
    assert counters.FieldValue.value.offset == 32
    fake = FakeNvml()
    monkeypatch.setattr(counters.ctypes, "CDLL", lambda name: fake)
    reader = counters.NvlinkCounters(counters.pci_bus_id(0, 0x1B, 0))
    assert fake.bus == b"00000000:1b:00.0"
    assert reader.read() == (2 * 2048 * 1024, 2 * 1024 * 1024)  # the second reading (the first checked)
    monkeypatch.setattr(counters.ctypes, "CDLL", lambda name: FakeNvml(value_type=0))
    with pytest.raises(counters.NvmlError, match="not an integer"):
        counters.NvlinkCounters("0:1:0")
    monkeypatch.setattr(counters.ctypes, "CDLL", lambda name: FakeNvml(field_return=3))
    with pytest.raises(counters.NvmlError, match="refused field 138"):
        counters.NvlinkCounters("0:1:0")


def test_no_nvml_library_is_a_reason_not_a_crash():
    with pytest.raises(counters.NvmlError, match="could not be loaded"):
        counters.NvlinkCounters("0:1:0", library="libnvidia-ml-that-is-not-here.so.1")


def test_nvml_counts_subtract_what_the_alignment_sends(monkeypatch):
    # three empty calls send 10 out and 20 in each; then two calls
    readings = iter([(0, 0), (10, 20), (20, 40), (30, 60), (30, 60), (130, 260), (230, 460)])

    class Reader:
        def __init__(self, bus_id):
            pass

        def read(self):
            return next(readings)

    monkeypatch.setattr(counters, "NvlinkCounters", Reader)
    monkeypatch.setattr(harness_profile, "_bus_id", lambda device: "0:1:0")
    settled: list[int] = []
    settle = lambda: settled.append(1)  # noqa: E731
    got = harness_profile.nvlink_counts(lambda: None, lambda: None, settle, "cuda:0", calls=2)
    assert len(settled) == 1 + 3 + 1 + 2  # before each reading
    assert got == {
        "nvlink": {
            "calls": 2,
            "tx_bytes": 200 - 2 * 10,
            "rx_bytes": 400 - 2 * 20,
            "per_call_tx": [100, 100],
            "per_call_rx": [200, 200],
            "baseline_tx": 10,
            "baseline_rx": 20,
        }
    }

    def refuse(bus_id):
        raise counters.NvmlError("NVML could not be loaded (here)")

    monkeypatch.setattr(counters, "NvlinkCounters", refuse)
    assert harness_profile.nvlink_counts(lambda: None, lambda: None, lambda: None, "cuda:0", 2) == {
        "nvlink_why": "NVML could not be loaded (here)"
    }


def test_nvml_counts_in_an_info_file_are_read_field_by_field():
    good = {"calls": 3, "tx_bytes": 9, "rx_bytes": 6, "per_call_tx": [3, 3, 3], "per_call_rx": [2, 2, 2]}
    good |= {"baseline_tx": 0, "baseline_rx": 0}
    assert traces.parse_info({"nvlink": good})["nvlink"] == good
    for forged in ({**good, "tx_bytes": -1}, {**good, "calls": 0}, {**good, "rx_bytes": "6"}, [good]):
        assert "nvlink" not in traces.parse_info({"nvlink": forged})
    assert traces.parse_info({"nvlink_why": "x" * 1000})["nvlink_why"] == "x" * 300


# ---------------------------------------------------------------- from counters to figures


def x(name, cat, ts, dur, pid=1, tid=100, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def one_call(ops, nvml=None, why=None, rank=0):
    """One rank's trace: a call on the host from 0 to 100 us launching `ops` (name, cat, start, duration)
    on stream 7, and its info file (NVML's counts of 3 calls, per call `nvml` = (tx, rx))."""
    events = [x(f"{traces.CALL_LABEL}1", "user_annotation", 0, 100)]
    for i, (name, cat, ts, dur) in enumerate(ops):
        events.append(x("cudaLaunchKernel", "cuda_runtime", 1 + i, 0.5, correlation=10 + i))
        events.append(x(name, cat, ts, dur, 0, 7, correlation=10 + i, stream=7))
    trace = traces.parse_trace({"traceEvents": events}, rank)
    info: dict = {"event_ms": [0.09]}
    if nvml is not None:
        info["nvlink"] = {
            "calls": 3,
            "tx_bytes": 3 * nvml[0],
            "rx_bytes": 3 * nvml[1],
            "per_call_tx": [nvml[0]] * 3,
            "per_call_rx": [nvml[1]] * 3,
            "baseline_tx": 0,
            "baseline_rx": 0,
        }
    if why is not None:
        info["nvlink_why"] = why
    trace.info = traces.parse_info(info)
    return trace


ONESHOT_CALL = [
    (ONESHOT, "kernel", 10, 40),
    (BARRIER, "kernel", 50, 5),
    (COPY, "gpu_memcpy", 60, 20),
    (FILL, "kernel", 85, 5),
]


def counted_ranks(world=2):
    return [
        nvlink.RankCounters(r, ncu=ncu_csv.read(FIXTURES / "raw_page.csv", nvlink.NCU_METRICS))
        for r in range(world)
    ]


def test_ncu_finds_the_fused_kernel_the_names_call_compute():
    side = [one_call(ONESHOT_CALL, nvml=(3 * MIB, 3 * MIB), rank=r) for r in range(2)]
    by_name = traces.analyze(side)
    assert by_name.top[0][:2] == (ONESHOT, "compute")  # the guess this issue is about
    m = nvlink.measure(by_name, side, counted_ranks(), "", floor_bytes=3 * MIB, limits=LIMITS)
    p = m.profile
    assert p.method == "ncu" and p.why == "" and p.passes == 1
    assert m.measured == {ONESHOT: "both"}  # the barrier moved 64 bytes: its name keeps it comm
    fused = next(k for k in p.kernels if k.name == ONESHOT and k.rank == 0)
    assert (fused.mechanism, fused.category, fused.source) == ("sm", "both", "ncu")
    assert fused.peer_bytes == 2 * MIB and fused.rx_bytes == 2 * MIB and fused.tx_bytes == 64 << 10
    assert fused.ms == 0.04 and fused.timed_by == "trace"  # the unreplayed call's duration
    assert fused.gbps is not None and fused.gbps == pytest.approx(2 * MIB / 40e-6 / 1e9, abs=0.1)
    assert fused.pct_of_ceiling == pytest.approx(100 * fused.gbps / 400, abs=0.1)
    copies = [k for k in p.kernels if k.mechanism == "copy_engine"]
    assert [(k.rank, k.name, k.source) for k in copies] == [(0, COPY, "ncu+nvml"), (1, COPY, "ncu+nvml")]
    assert copies[0].tx_bytes == 3 * MIB - (64 << 10) - 128  # the call's NVML bytes beyond its kernels'
    assert not any(k.name == FILL for k in p.kernels), "peers' traffic while it ran is not its own"
    assert [(r.rank, r.tx_bytes, r.source) for r in p.ranks] == [(0, 3 * MIB, "nvml"), (1, 3 * MIB, "nvml")]
    assert p.moved_vs_floor == 1.0
    # the timing figures take the measured categories: the fused kernel is communication and compute
    figures = traces.analyze(side, m.measured)
    call = figures.calls[0][0]
    assert call.comm_us == 40 + 5 + 20 and call.compute_us == 40 + 5 and call.overlap_us == 40
    assert {b.category for b in call.bars if b.start == 10} == {"both"}
    said = nvlink.findings("candidate", m, figures)
    assert any("shown as both" in f for f in said)
    sm = [f for f in said if "by SM loads and stores to peer memory at" in f]
    assert sm and "% of the NVLink ceiling" in sm[0]
    assert any(f.startswith("candidate: the bottleneck is void oneshot_sum_bf16") for f in said)
    assert any("not near a counted ceiling" in f for f in said)


def test_bytes_faster_than_the_link_are_not_credited_to_a_copy():
    # seen on 2 H200s: a peer's writes that arrived while ncu counted none of this rank's kernels were
    # the whole NVML remainder, and a 2 us local copy "moved" them at 170% of the link
    call = [(ONESHOT, "kernel", 10, 40), (BARRIER, "kernel", 50, 5), (COPY, "gpu_memcpy", 60, 2)]
    side = [one_call(call, nvml=(3 * MIB, 3 * MIB), rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, counted_ranks(), "", floor_bytes=3 * MIB, limits=LIMITS)
    kernels = m.profile.kernels
    assert not [k for k in kernels if k.mechanism == "copy_engine"]
    rest = [k for k in kernels if k.name == nvlink.REMAINDER]
    assert [(k.rank, k.mechanism, k.gbps, k.ms) for k in rest] == [
        (0, "unattributed", None, None),
        (1, "unattributed", None, None),
    ]
    assert rest[0].tx_bytes == 3 * MIB - (64 << 10) - 128  # still counted: the rank's total stays whole
    said = nvlink.findings("candidate", m, traces.analyze(side, m.measured))
    assert any(nvlink.REMAINDER in f and "source not told apart" in f and " at " not in f for f in said), said


def test_nccl_kernels_are_named_by_mechanism_and_bound_by_nvlink_when_near_the_ceiling():
    side = [one_call([(NCCL_KERNEL, "kernel", 10, 6)], nvml=(2 * MIB, 2 * MIB), rank=r) for r in range(2)]
    details = ncu_csv.read(FIXTURES / "details_page.csv", nvlink.NCU_METRICS)
    counted = [nvlink.RankCounters(r, ncu=details) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, counted, "", None, LIMITS)
    assert {(k.mechanism, k.category) for k in m.profile.kernels} == {("nccl", "comm")}
    assert m.bounds[(0, NCCL_KERNEL)] == "NVLink"  # 2 MiB in 6 us: 350 GB/s of 400
    said = nvlink.findings("reference", m, traces.analyze(side, m.measured))
    assert any("by NCCL's kernel" in f for f in said) and any("NVLink-bound" in f for f in said)


def test_without_the_peer_counter_the_gpu_s_bytes_decide_and_the_result_says_so():
    csv = (FIXTURES / "raw_page.csv").read_text()
    metrics = [m for m in nvlink.NCU_METRICS if m != nvlink.PEER_SECTORS]
    counted = [nvlink.RankCounters(r, ncu=ncu_csv.parse(csv, metrics)) for r in range(2)]
    side = [one_call(ONESHOT_CALL, nvml=(3 * MIB, 3 * MIB), rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, counted, "", None, LIMITS)
    assert m.measured[FILL] == "both", "peers' reads while it ran now count as its own"
    assert any("peers' traffic included" in n for n in m.profile.notes)
    assert {k.mechanism for k in m.profile.kernels if k.source == "ncu"} == {"unattributed"}


def test_a_rank_without_counters_falls_back_to_nvml_saying_why():
    side = [one_call(ONESHOT_CALL, nvml=(3 * MIB, 3 * MIB), rank=r) for r in range(2)]
    counted = counted_ranks()
    counted[1] = nvlink.RankCounters(1, error="the ncu log holds no CSV of profiled kernels")
    m = nvlink.measure(traces.analyze(side), side, counted, "", None, LIMITS)
    assert m.profile.method == "nvml" and m.measured == {}
    assert m.profile.why == "rank 1's counters: the ncu log holds no CSV of profiled kernels"
    assert m.profile.kernels == []  # two operations are named for communication: the bytes are the call's


def test_nvml_gives_the_call_s_bytes_to_its_one_communicating_name():
    side = [one_call([(NCCL_KERNEL, "kernel", 10, 20)], nvml=(MIB, MIB), rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, None, "no ncu here", MIB, LIMITS)
    assert (m.profile.method, m.profile.why) == ("nvml", "no ncu here")
    assert {(k.name, k.mechanism, k.source) for k in m.profile.kernels} == {(NCCL_KERNEL, "nccl", "nvml")}
    hidden = [one_call([(ONESHOT, "kernel", 10, 40)], nvml=(MIB, MIB), rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(hidden), hidden, None, "no ncu here", MIB, LIMITS)
    assert len(m.profile.notes) == 2 and "its name hides" in m.profile.notes[0]
    said = nvlink.findings("candidate", m, traces.analyze(hidden))
    assert any("1x the traffic model's floor of 1 MiB" in f for f in said)
    assert any("its bound is not measured (nvml: no ncu here)" in f for f in said)


def test_names_when_neither_counter_answered():
    why = "NVML could not be loaded (libnvidia-ml.so.1: not found)"
    side = [one_call(ONESHOT_CALL, why=why, rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, None, "ncu was not found", None, LIMITS)
    assert m.profile.method == "names" and m.profile.ranks == [] and m.measured == {}
    assert m.profile.why == f"ncu was not found; NVML: {why}"


# ---------------------------------------------------------------- a launch under a stand-in for ncu

STAND_IN = """#!{python}
# A stand-in for ncu: records its options, writes a log as ncu would, then runs the program after them.
import json, os, sys
args = sys.argv[1:]
start = args.index({python!r})
options = args[:start]
log = options[options.index("--log-file") + 1]
with open(log, "w") as f:
    f.write('==PROF== stand-in\\n"ID","Kernel Name","nvlrx__bytes.sum"\\n"","","byte"\\n"0","k","1"\\n')
with open(os.path.join(os.path.dirname(log), "stand-in-" + os.path.basename(log) + ".json"), "w") as f:
    json.dump({{"options": options, "tmpdir": os.environ.get("TMPDIR")}}, f)
os.execv(args[start], args[start:])
"""


@pytest.mark.integration
def test_a_counter_launch_starts_every_rank_under_its_own_ncu(tmp_path):
    from pkb_mcp.launches import run_launch
    from pkb_mcp.models import RunRequest
    from pkb_mcp.runs.run import Run

    tool = tmp_path / "ncu"
    tool.write_text(STAND_IN.format(python=sys.executable))
    tool.chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    problem = root / "problems" / "001_allreduce.py"
    asked = RunRequest(problem=1, path=problem, world_size=2, device="cpu", sandbox="process", timeout_s=120)
    run = Run(asked)
    request = run.launch_request("outputs", problem, [7])
    plan: CounterPlan = {"tool": "ncu", "ncu": str(tool), "metrics": ["nvlrx__bytes.sum"], "max_kernels": 5}
    request.settings["counters"] = plan
    request.cold = True

    def collect(launch_dir):
        folder = launch_dir / "profile"
        seen = {p.name: json.loads(p.read_text()) for p in folder.glob("stand-in-*.json")}
        return seen, nvlink.read_counter_launch(launch_dir, 2, plan["metrics"])

    outcome = run_launch(request, run.backend, collect=collect)
    assert outcome.ok, [(r.state, r.error, r.log_tail[-500:]) for r in outcome.ranks]
    seen, ranks = outcome.collected
    assert sorted(seen) == ["stand-in-r0.ncu.csv.json", "stand-in-r1.ncu.csv.json"]
    tmpdirs = {v["tmpdir"] for v in seen.values()}
    assert len(tmpdirs) == 2 and all(os.path.basename(t).startswith("ncu-r") for t in tmpdirs)
    assert all("--clock-control" in v["options"] for v in seen.values())
    assert [(r.rank, [k.name for k in r.ncu.kernels]) for r in ranks if r.ncu] == [(0, ["k"]), (1, ["k"])]


def test_the_result_says_what_counted_and_at_what_cost():
    from pkb_mcp.profiling import profile

    def side(method, why="", passes=None):
        return nvlink.Measurement(nvlink.NvlinkProfile(method=method, why=why, passes=passes))

    sides = {"candidate": side("ncu", passes=1), "reference": side("nvml", "the counter launch failed: x")}
    counted = {"candidate": profile.Counted([], "", 41.0), "reference": profile.Counted(None, "x", 180.0)}
    text = profile._counters_text(sides, counted)
    assert text.startswith("NVLink bytes candidate: per kernel from ncu, in a counter launch of 41 s")
    assert "up to 1 pass(es) a kernel" in text and "reference: per call from NVML, kernels by name" in text
    assert text.endswith("the timing figures are the unreplayed trace launch's")
    cpu = {s: side("names", "the launch ran on CPU") for s in ("candidate", "reference")}
    assert profile._counters_text(cpu, {}) == (
        "NVLink bytes not measured, communication by kernel name: the launch ran on CPU"
    )


def test_kernels_match_by_full_name_else_by_function_name_in_order():
    assert nvlink.function_name(FILL) == "vectorized_elementwise_kernel"
    assert nvlink.function_name(ONESHOT) == nvlink.function_name("oneshot_sum_bf16") == "oneshot_sum_bf16"
    csv = (FIXTURES / "raw_page.csv").read_text().replace(f'"{ONESHOT}"', '"oneshot_sum_bf16"')
    counted = [nvlink.RankCounters(r, ncu=ncu_csv.parse(csv, nvlink.NCU_METRICS)) for r in range(2)]
    side = [one_call(ONESHOT_CALL, nvml=(3 * MIB, 3 * MIB), rank=r) for r in range(2)]
    m = nvlink.measure(traces.analyze(side), side, counted, "", None, LIMITS)
    fused = [k for k in m.profile.kernels if k.mechanism == "sm"]
    assert [(k.name, k.timed_by, k.ms) for k in fused] == [(ONESHOT, "trace", 0.04)] * 2
    assert m.measured == {ONESHOT: "both"}
