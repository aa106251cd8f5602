"""Profiler traces written in the sandbox: read without trusting them, and turned into figures.

A rank's trace (torch.profiler's Chrome trace export, harness/profile.py) is read with caps on bytes,
JSON containers and events; only complete events with well-formed fields are kept, and of their
args only a few integers. A forged or broken file makes that rank's profile missing, with the reason:
it can mislead its own report, never crash or exhaust the host. From the kept events this module
computes, per rank and call, the figures that docs/measurement.md ("Profile") defines, and writes the
merged Chrome trace of all ranks. Standard library only.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.untrusted import LaunchFiles

TRACE_CAP = 16 << 20  # bytes of one rank's trace file
INFO_CAP = 64 << 10
MAX_CONTAINERS = 1_000_000  # `{` and `[` in a trace file: bounds the objects json.loads can make
MAX_EVENTS = 200_000  # kept events per rank
SIDE_EVENTS = 400_000  # kept events over a side's ranks (each rank gets its share): bounds host memory
NAME_CHARS = 200
MERGED_CAP = 32 << 20  # bytes of the merged trace

CALL_LABEL = "pkb.call#"  # harness/profile.py
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
SKIPPED_CATS = frozenset({"Trace"})
# communication on the device: NCCL, torch symmetric memory, kernels named for a collective
COMM_KERNEL = re.compile(
    r"nccl|symm|one_shot|two_shot|multimem|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
    r"|barrier_kernel|put_signal|wait_signal",
    re.IGNORECASE,
)
# communication on the host: gloo's and NCCL's record_function ranges, c10d ops
HOST_COMM = re.compile(r"^(gloo:|nccl:|c10d::|_c10d_functional::|c10d_functional::|record_param_comms)")
CATEGORIES = ("comm", "compute", "other")
COMMUNICATING = frozenset({"comm", "both"})  # "both": a kernel measured communicating that computes too


class TraceError(ValueError):
    """A trace or info file that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    cat: str
    ts: float  # microseconds
    dur: float
    pid: int | str
    tid: int | str
    corr: int | None = None  # CUDA correlation id: a launch and its device work share it
    stream: int | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def on_device(self) -> bool:
        return self.cat in DEVICE_CATS

    @property
    def device_row(self) -> bool:
        """Drawn on a GPU stream's row in the merged trace (device work and its annotations)."""
        return self.cat in DEVICE_CATS or self.cat.startswith("gpu_")


@dataclass
class RankTrace:
    rank: int
    events: list[Event] = field(default_factory=list)
    threads: dict[tuple[int | str, int | str], str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    cut_events: int = 0
    error: str | None = None  # why this rank's profile is missing


# ---------------------------------------------------------------- reading


def read_capped(path: Path, cap: int, root: Path | None = None) -> bytes:
    """A file the sandbox wrote, through the launch's doorway (sandbox/untrusted.py) anchored at
    `root`, the launch directory that `path` lies under (default: the file's own folder): no link
    followed on the way from `root`, nothing but a plain file read, at most `cap` bytes."""
    root = root or path.parent
    files = LaunchFiles(root, budget=cap)
    rel = str(path.relative_to(root))
    kind = files.kind(rel)
    if kind != "a file":
        raise TraceError(f"{path.name} is missing" + ("" if kind is None else f" (it is {kind})"))
    size = files.size(rel) or 0
    if size > cap:
        raise TraceError(f"{path.name} is {size} bytes, over the {cap}-byte limit")
    data = files.read(rel, cap)
    if data is None:
        raise TraceError(f"{path.name} could not be read: {'; '.join(files.refusals) or 'it went away'}")
    return data


def load_json(path: Path, cap: int, max_containers: int | None = None, root: Path | None = None) -> Any:
    """A JSON file the sandbox wrote: size-capped, container-capped, never anything but JSON."""
    data = read_capped(path, cap, root)
    max_containers = MAX_CONTAINERS if max_containers is None else max_containers
    if data.count(b"{") + data.count(b"[") > max_containers:
        raise TraceError(f"{path.name} holds more than {max_containers} JSON objects and arrays")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{path.name} is not valid JSON: {str(exc)[:120]}") from exc


def _number(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    return float(value)


def _ident(value: Any) -> int | str | None:
    if type(value) is int:
        return value
    if isinstance(value, str) and len(value) <= 64:
        return value
    return None


def _small_int(args: Any, key: str) -> int | None:
    value = args.get(key) if isinstance(args, dict) else None
    return value if type(value) is int and -(1 << 62) < value < (1 << 62) else None


def parse_trace(data: Any, rank: int, max_events: int | None = None) -> RankTrace:
    """The usable events of one rank's Chrome trace (already parsed JSON, untrusted): at most
    `max_events` (default MAX_EVENTS), the later ones counted as cut."""
    limit = MAX_EVENTS if max_events is None else max_events
    raw = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise TraceError("the trace has no traceEvents list")
    out = RankTrace(rank=rank)
    for e in raw:
        if not isinstance(e, dict):
            continue
        ph, name = e.get("ph"), e.get("name")
        pid, tid = _ident(e.get("pid")), _ident(e.get("tid"))
        if not isinstance(name, str) or pid is None or tid is None:
            continue
        if ph == "M":
            args = e.get("args")
            label = args.get("name") if isinstance(args, dict) else None
            if name == "thread_name" and isinstance(label, str) and len(out.threads) < 4096:
                out.threads[(pid, tid)] = label[:80]
            continue
        cat = e.get("cat")
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        if ph != "X" or not isinstance(cat, str) or cat in SKIPPED_CATS or ts is None or dur is None:
            continue
        if dur < 0 or dur > 1e12 or abs(ts) > 1e15:
            continue
        if len(out.events) >= limit:
            out.cut_events += 1
            continue
        args = e.get("args")
        out.events.append(
            Event(
                name=sys.intern(name[:NAME_CHARS]),  # kernel names repeat: one string each
                cat=sys.intern(cat[:40]),
                ts=ts,
                dur=dur,
                pid=pid,
                tid=tid,
                corr=_small_int(args, "correlation"),
                stream=_small_int(args, "stream"),
            )
        )
    out.events.sort(key=lambda ev: ev.ts)
    return out


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 62 else None


def parse_nvlink(data: Any) -> dict[str, Any] | None:
    """NVML's counts in an info file (harness/contracts.py NvlinkCounts), only when every field is
    well-formed."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("calls", "tx_bytes", "rx_bytes", "baseline_tx", "baseline_rx"):
        out[key] = _count(data.get(key))
    for key in ("per_call_tx", "per_call_rx"):
        values = data.get(key)
        if isinstance(values, list) and len(values) <= 1000:
            out[key] = [v for v in (_count(v) for v in values) if v is not None]
    if any(v is None for v in out.values()) or not out["calls"]:
        return None
    return out


def parse_info(data: Any) -> dict[str, Any]:
    """The rank's info file: call times in ms, NVML's NVLink counts or why there are none, and the
    calls a counter launch counted."""
    if not isinstance(data, dict):
        raise TraceError("the info file is not a JSON object")
    info: dict[str, Any] = {}
    ms = data.get("event_ms")
    if isinstance(ms, list) and len(ms) <= 1000:
        values = [_number(v) for v in ms]
        info["event_ms"] = [v for v in values if v is not None and v >= 0]
    why = data.get("nvlink_why")
    if isinstance(why, str):
        info["nvlink_why"] = why[:300]
    nvlink = parse_nvlink(data.get("nvlink"))
    if nvlink is not None:
        info["nvlink"] = nvlink
    for key in ("warmup_calls", "calls", "counted"):
        if type(data.get(key)) is int and 0 <= data[key] < 1 << 31:
            info[key] = data[key]
    return info


def read_rank(
    profile_dir: Path, rank: int, max_events: int | None = None, root: Path | None = None
) -> RankTrace:
    """One rank's trace and info, or a RankTrace carrying the reason it is missing; `root`: the
    launch directory `profile_dir` lies in (read_capped)."""
    try:
        trace_file, info_file = profile_dir / f"r{rank}.trace.json", profile_dir / f"r{rank}.info.json"
        trace = parse_trace(load_json(trace_file, TRACE_CAP, root=root), rank, max_events)
        trace.info = parse_info(load_json(info_file, INFO_CAP, 10_000, root=root))
    except TraceError as exc:
        return RankTrace(rank=rank, error=str(exc))
    return trace


def read_launch(launch_dir: Path, world_size: int) -> list[RankTrace]:
    """Every rank's trace from a profile launch's directory (run_launch's `collect`), each rank kept to its
    share of SIDE_EVENTS."""
    share = min(MAX_EVENTS, max(SIDE_EVENTS // max(world_size, 1), 10_000))
    return [read_rank(launch_dir / "profile", rank, share, root=launch_dir) for rank in range(world_size)]


# ---------------------------------------------------------------- intervals

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def length(merged: list[Interval]) -> float:
    return sum(hi - lo for lo, hi in merged)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The intersection of two merged interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


# ---------------------------------------------------------------- one call on one rank


Measured = Mapping[str, str]  # kernel name -> "comm" or "both", from counters (pkb_mcp/profiling/nvlink.py)


def category(e: Event, measured: Measured | None = None) -> str:
    """comm, compute or other by name (docs/measurement.md, "Profile"); a kernel found communicating
    by counters takes its measured category instead: comm, or both (it communicates and its name says
    compute), which counts as communication and as compute (docs/nvlink-counters.md)."""
    if measured and e.cat == "kernel" and e.name in measured:
        return measured[e.name]
    if e.on_device:
        if e.cat == "gpu_memset":
            return "other"
        if e.cat == "gpu_memcpy":
            return "comm" if ("DtoD" in e.name or "PtoP" in e.name) else "other"
        return "comm" if COMM_KERNEL.search(e.name) else "compute"
    return "comm" if HOST_COMM.match(e.name) else "compute"


@dataclass
class Bar:
    """One piece of work in a call, for the timeline: which row, when (us), which category."""

    row: str
    start: float
    end: float
    category: str


@dataclass
class CallFigures:
    window: Interval  # us
    comm_us: float
    compute_us: float
    other_us: float
    overlap_us: float
    busy_us: float
    launches: int
    enqueue_us: float
    transfers: list[Interval]  # communication intervals matched across ranks for `wait`
    work: list[tuple[Event, str]]  # the call's events with their categories
    bars: list[Bar]
    wait_us: float | None = None

    @property
    def window_us(self) -> float:
        return self.window[1] - self.window[0]

    @property
    def gap_us(self) -> float:
        return max(self.window_us - self.busy_us, 0.0)

    def parts(self) -> dict[str, float]:
        """Where the window went: exclusive parts that add up to it (for "what the slowest rank does")."""
        return {
            "communication not overlapped": self.comm_us - self.overlap_us,
            "compute": self.compute_us,
            "other device work": max(self.busy_us - self.comm_us - self.compute_us + self.overlap_us, 0.0),
            "gaps": self.gap_us,
        }


def _row_of(trace: RankTrace, e: Event, main: int | str) -> str:
    """The timeline row of an event: a GPU stream, the calling thread, or another thread by id
    (thread names are not reliable: a reused thread id keeps several)."""
    if e.on_device:
        return f"rank {trace.rank} stream {e.stream if e.stream is not None else e.tid}"
    return f"rank {trace.rank} " + ("calling thread" if e.tid == main else f"thread {e.tid}")


def call_ranges(trace: RankTrace) -> list[Event]:
    """The calling thread's `pkb.call#<i>` ranges, in order (not their copies on the device rows,
    which cover only the kernels no inner annotation claimed)."""
    return [e for e in trace.events if not e.device_row and e.name.startswith(CALL_LABEL)]


def _top_level(events: list[Event]) -> list[Event]:
    """Events not nested inside an earlier one (events sorted by start)."""
    out: list[Event] = []
    for e in events:
        if out and e.end <= out[-1].end + 1e-3:
            continue
        out.append(e)
    return out


def call_figures(
    trace: RankTrace, call: Event, on_gpu: bool, measured: Measured | None = None
) -> CallFigures:
    """The figures of one call on one rank (docs/measurement.md, "Profile"), with kernels categorised
    by `measured` where it names them."""
    lo, hi = call.ts, call.end
    main = call.tid
    work: list[tuple[Event, str]] = []
    clip: list[tuple[Event, float, float]] = []
    if on_gpu:
        launched = {
            e.corr
            for e in trace.events
            if e.cat in LAUNCH_CATS and e.tid == main and e.corr is not None and lo <= e.ts <= hi
        }
        device = [e for e in trace.events if e.on_device and e.corr in launched]
        for e in device:
            work.append((e, category(e, measured)))
            clip.append((e, e.ts, e.end))
        window = (min(e.ts for e in device), max(e.end for e in device)) if device else (lo, hi)
        transfers = [(e.ts, e.end) for e, c in work if c in COMMUNICATING]
        launches = len(device)
    else:
        window = (lo, hi)
        inside = [
            e
            for e in trace.events
            if e.tid == main and e.cat == "cpu_op" and e.ts >= lo and e.end <= hi + 1e-3 and e is not call
        ]
        ops = _top_level(inside)
        others = [
            e
            for e in trace.events
            if e.tid != main and HOST_COMM.match(e.name) and e.end > lo and e.ts < hi and not e.on_device
        ]
        for e in ops + others:
            work.append((e, category(e)))
            clip.append((e, max(e.ts, lo), min(e.end, hi)))
        transfers = [(max(e.ts, lo), min(e.end, hi)) for e in others] or [
            (e.ts, e.end) for e in ops if category(e) == "comm"
        ]
        launches = len(ops)
    spans: dict[str, list[Interval]] = {c: [] for c in CATEGORIES}
    bars = []
    for (e, c), (_, a, b) in zip(work, clip, strict=True):
        for part in ("comm", "compute") if c == "both" else (c,):
            spans[part].append((a, b))
        bars.append(Bar(_row_of(trace, e, main), a, b, c))
    merged = {c: union(v) for c, v in spans.items()}
    return CallFigures(
        window=window,
        comm_us=length(merged["comm"]),
        compute_us=length(merged["compute"]),
        other_us=length(merged["other"]),
        overlap_us=length(intersect(merged["comm"], merged["compute"])),
        busy_us=length(union([i for v in spans.values() for i in v])),
        launches=launches,
        enqueue_us=call.dur,
        transfers=sorted(transfers),
        work=work,
        bars=bars,
    )


def set_waits(ranks: list[CallFigures]) -> bool:
    """Each rank's wait in one call: for its k-th communication interval, the part before the last
    rank started its own k-th. Only when every rank has the same number of them (else False)."""
    counts = {len(r.transfers) for r in ranks}
    if len(counts) != 1 or len(ranks) < 2:
        return False
    n = counts.pop()
    for r in ranks:
        r.wait_us = 0.0
    for k in range(n):
        last = max(r.transfers[k][0] for r in ranks)
        for r in ranks:
            lo, hi = r.transfers[k]
            r.wait_us = (r.wait_us or 0.0) + min(max(last - lo, 0.0), hi - lo)
    return True


# ---------------------------------------------------------------- a side: every rank, every call


@dataclass
class SideFigures:
    """Every rank's figures for every profiled call of one side (reference or candidate)."""

    calls: list[list[CallFigures]]  # [call][rank], over the ranks whose trace was read
    ranks: list[int]
    missing: dict[int, str]
    waits_matched: int  # calls whose communication matched across ranks
    event_ms: list[float]  # harness device-event times of the calls (the slowest rank's)
    top: list[tuple[str, str, float, float]]  # (name, category, us per call and rank, count)
    median_call: int
    on_gpu: bool = False  # device activity was recorded (CUPTI)


def analyze(traces: list[RankTrace], measured: Measured | None = None) -> SideFigures:
    """Every rank's figures for every call; kernels categorised by `measured` where it names them."""
    ok = [t for t in traces if t.error is None and call_ranges(t)]
    missing = {t.rank: t.error or "no profiled call in the trace" for t in traces if t not in ok}
    on_gpu = any(e.on_device for t in ok for e in t.events)
    per_rank = {t.rank: [call_figures(t, c, on_gpu, measured) for c in call_ranges(t)] for t in ok}
    n_calls = min((len(v) for v in per_rank.values()), default=0)
    calls = [[per_rank[t.rank][i] for t in ok] for i in range(n_calls)]
    matched = sum(set_waits(c) for c in calls)
    event_ms: list[float] = []
    for i in range(n_calls):
        times = [t.info["event_ms"][i] for t in ok if len(t.info.get("event_ms", [])) > i]
        if times:
            event_ms.append(max(times))
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    cats: dict[str, str] = {}
    for c in calls:
        for r in c:
            for e, cat in r.work:
                totals[e.name][0] += e.dur
                totals[e.name][1] += 1
                cats[e.name] = cat
    scale = max(n_calls * len(ok), 1)
    top = sorted(
        ((name, cats[name], t[0] / scale, t[1] / scale) for name, t in totals.items()),
        key=lambda x: -x[2],
    )[:5]
    slowest = [max(r.window_us for r in c) for c in calls]
    median_call = (
        min(range(n_calls), key=lambda i: abs(slowest[i] - statistics.median(slowest))) if calls else 0
    )
    return SideFigures(
        calls=calls,
        ranks=[t.rank for t in ok],
        missing=missing,
        waits_matched=matched,
        event_ms=event_ms,
        top=top,
        median_call=median_call,
        on_gpu=on_gpu,
    )


def slowest_rank(side: SideFigures) -> tuple[int | None, float | None, str]:
    """(the rank the others wait for most often, the others' mean wait in ms per call, what it does
    meanwhile): from the calls whose communication matched across ranks; else the rank with the
    longest window, no wait and no reason."""
    matched = [c for c in side.calls if all(r.wait_us is not None for r in c) and len(c) > 1]
    if not matched:
        if not side.calls:
            return None, None, ""
        longest = [max(range(len(c)), key=lambda i: c[i].window_us) for c in side.calls]
        return side.ranks[statistics.mode(longest)], None, ""
    picks = [min(range(len(c)), key=lambda i: (c[i].wait_us or 0.0, -c[i].window_us)) for c in matched]
    pick = statistics.mode(picks)
    rank = side.ranks[pick]
    waits = [statistics.fmean(r.wait_us or 0.0 for j, r in enumerate(c) if j != pick) for c in matched]
    excess: dict[str, float] = defaultdict(float)
    for c in matched:
        first = min(r.window[0] for r in c)
        parts = [{**r.parts(), "start": r.window[0] - first} for r in c]
        for key, value in parts[pick].items():
            others = statistics.fmean(o[key] for j, o in enumerate(parts) if j != pick)
            excess[key] += (value - others) / len(matched)
    key = max(excess, key=lambda k: excess[k])
    if excess[key] <= 0:
        reason = ""
    elif key == "start":
        reason = f"it starts its calls {excess[key] / 1e3:.3g} ms after them"
    else:
        reason = f"it spends {excess[key] / 1e3:.3g} ms more in {key} than they do"
    return rank, statistics.fmean(waits) / 1e3, reason


# ---------------------------------------------------------------- the merged trace


def merged_trace(
    sides: dict[str, list[RankTrace]], cap: int = MERGED_CAP, measured: Mapping[str, Measured] | None = None
) -> tuple[bytes, int, int]:
    """One Chrome trace of every side and rank: (JSON bytes, events written, events cut); each event's
    category as the side's figures have it (`measured`: per side).

    One process per side and rank ("candidate rank 0", ...), host threads and GPU streams as its
    threads, each side's time from 0. Rebuilt from the validated events only. Past `cap` bytes each
    side keeps its earliest events, in an equal share of the cap."""
    meta: list[str] = []
    body: list[str] = []
    written = cut = 0
    share = cap // max(len(sides), 1) - (64 << 10)
    for s, (side, traces) in enumerate(sides.items()):
        usable = [t for t in traces if t.error is None and t.events]
        if not usable:
            continue
        t0 = min(t.events[0].ts for t in usable)
        used = 0
        rows: list[tuple[float, int, int, Event]] = []
        for t in usable:
            pid = 1 + 100 * s + t.rank
            meta.append(_meta(pid, 0, "process_name", {"name": f"{side} rank {t.rank}"}))
            meta.append(_meta(pid, 0, "process_sort_index", {"sort_index": pid}))
            tids: dict[tuple[bool, int | str, int | str], int] = {}
            for e in t.events:
                key = (e.device_row, e.pid, e.stream if e.device_row and e.stream is not None else e.tid)
                if key not in tids:
                    tid = len(tids) + (1000 if e.device_row else 1)
                    tids[key] = tid
                    label = (
                        f"GPU stream {key[2]}"
                        if e.device_row
                        else "host " + t.threads.get((e.pid, e.tid), f"thread {e.tid}")
                    )
                    meta.append(_meta(pid, tid, "thread_name", {"name": label}))
                rows.append((e.ts, pid, tids[key], e))
        rows.sort(key=lambda r: r[0])
        for _, pid, tid, e in rows:
            text = json.dumps(
                {
                    "ph": "X",
                    "name": e.name,
                    "cat": e.cat,
                    "ts": round(e.ts - t0, 3),
                    "dur": round(e.dur, 3),
                    "pid": pid,
                    "tid": tid,
                    "args": {"pkb category": category(e, (measured or {}).get(side))}
                    if not e.name.startswith(CALL_LABEL)
                    else {},
                }
            )
            if used + len(text) + 2 > share:
                cut += 1
                continue
            used += len(text) + 2
            body.append(text)
            written += 1
    head = json.dumps({"displayTimeUnit": "ms", "otherData": {"pkb": "docs/measurement.md", "cut": cut}})
    text = head[:-1] + ', "traceEvents": [\n' + ",\n".join(meta + body) + "\n]}\n"
    return text.encode(), written, cut


def _meta(pid: int, tid: int, kind: str, args: dict[str, Any]) -> str:
    return json.dumps({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args})
