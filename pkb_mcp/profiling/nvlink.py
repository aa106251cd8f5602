"""NVLink bytes in a profile (docs/nvlink-counters.md, which defines every figure here).

- `plan`: whether a side gets a counter launch (every rank under its own Nsight Compute), or why not;
- `read_counter_launch`: what its ranks left (each rank's ncu log and info file), read as untrusted;
- `measure`: from those and the trace launch's NVML counts, the side's `NvlinkProfile` (bytes per rank
  and call, the communicating kernels with their mechanism and achieved bandwidth beside the
  ceiling and the problem's floor), the kernel categories the timing figures take (`Measured`), and
  each counted kernel's bound;
- `findings`: the sentences an agent reads about them.

The method is the best source every rank of the side had: `ncu`, else `nvml`, else `names`.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness import counters
from harness.contracts import CounterPlan
from pkb_mcp import config
from pkb_mcp.models import Ceilings, Result
from pkb_mcp.profiling import ncu_csv, traces

Method = Literal["ncu", "nvml", "names"]
METHOD_RANK = {"names": 0, "nvml": 1, "ncu": 2}
# Metric names from Nsight Compute's documentation and rule files; not yet seen on our machines.
RX, TX = "nvlrx__bytes.sum", "nvltx__bytes.sum"  # the GPU's NVLink bytes while the kernel ran, protocol in
RX_USER, TX_USER = "nvlrx__bytes_data_user.sum", "nvltx__bytes_data_user.sum"  # user payload only
PEER_SECTORS = "lts__t_sectors_srcunit_tex_aperture_peer.sum"  # the kernel's loads/stores to peer memory
DURATION = "gpu__time_duration.sum"  # ns, under the tool (serialised)
DRAM = "dram__bytes.sum"  # optional (PKB_NCU_METRICS): HBM bound
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"  # optional: compute bound
NCU_METRICS = [DURATION, RX, TX, RX_USER, TX_USER, PEER_SECTORS]
NCU_MAX_KERNELS = 200  # kernels counted per rank (ncu --launch-count): the cost bound of one call
COUNTER_TIMEOUT_S = 180.0
SECTOR_BYTES = 32
COMM_MIN_BYTES = 4096
COMM_SHARE = 0.01  # of the call's moved bytes: below both, a kernel did not communicate
BOUND_PCT = 60.0  # of a ceiling: a kernel that near it is bound by it
# of the NVLink ceiling: copies "faster" than this did not move the bytes given to them (measured on
# 2 H200s, 2026-11-27: a peer's NCCL writes that arrived while ncu counted none of this rank's kernels
# were put on a local DtoD copy at 170% of the link)
IMPOSSIBLE_PCT = 110.0
REMAINDER = "remainder (NVML's total less the counted kernels')"
SHOWN_KERNELS = 8
NCCL = re.compile(r"nccl", re.IGNORECASE)
PEER_COPY = re.compile(r"PtoP|DtoD")


# ---------------------------------------------------------------- results


class KernelBytes(Result):
    # A communicating kernel (or copy) of one rank, per call (docs/nvlink-counters.md).
    rank: int
    name: str
    mechanism: str = Field(description="nccl, sm (loads/stores to peers), copy_engine, unattributed")
    category: str = Field(description="comm, or both: it communicates and computes")
    tx_bytes: int
    rx_bytes: int
    peer_bytes: int | None = Field(None, description="sent to peer memory by its own loads and stores")
    ms: float | None = Field(None, description="its time in the unreplayed call (or under ncu: timed_by)")
    gbps: float | None = Field(None, description="max(tx, rx) / ms")
    pct_of_ceiling: float | None = None
    timed_by: str = "trace"
    source: str = Field(description="ncu; nvml: the call's bytes, given to it by its name")


class RankBytes(Result):
    rank: int
    tx_bytes: int = Field(description="sent over NVLink per call")
    rx_bytes: int
    source: str = Field(description="nvml, or ncu (its kernels' sum)")


class NvlinkProfile(Result):
    method: Method
    why: str = Field("", description="why no better method")
    ranks: list[RankBytes] = Field(default_factory=list)
    kernels: list[KernelBytes] = Field(default_factory=list)
    floor_bytes: float | None = Field(None, description="traffic model: per GPU and call, each way")
    moved_vs_floor: float | None = Field(None, description="mean over ranks of max(tx, rx) / floor")
    ceiling_gbps: float | None = None
    ceiling: str = ""
    passes: int | None = Field(None, description="most replay passes ncu made of a kernel")
    counter_launch_s: float | None = None
    notes: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------- the counter launch


def plan(device: str, isolated: bool) -> tuple[CounterPlan | None, str]:
    """The counter launch of a profile on this node, or why there is none (the process sandbox sees
    this machine, so what the host finds is what the ranks find)."""
    if device != "cuda":
        return None, "the launch ran on CPU"
    if isolated:
        return None, (
            "per-kernel counters need the process sandbox: the Docker sandbox has no Nsight Compute "
            "mounted and no capabilities for performance counters"
        )
    ncu = counters.find_ncu()
    why = counters.ncu_unavailable(device, ncu)
    if why is not None or ncu is None:
        return None, why or "Nsight Compute (ncu) was not found"
    metrics = config.ncu_metrics(NCU_METRICS)
    return {"tool": "ncu", "ncu": ncu, "metrics": metrics, "max_kernels": NCU_MAX_KERNELS}, ""


@dataclass
class RankCounters:
    """What one rank of a counter launch left: ncu's kernels, NVML's count of the call, or why not."""

    rank: int
    ncu: ncu_csv.NcuRead | None = None
    nvml: dict[str, Any] | None = None
    error: str | None = None


def read_counter_launch(launch_dir: Path, world_size: int, metrics: list[str]) -> list[RankCounters]:
    """Every rank's counters from a counter launch's directory (run_launch's `collect`)."""
    out = []
    for rank in range(world_size):
        got = RankCounters(rank)
        folder = launch_dir / "profile"
        try:
            info_file = folder / f"r{rank}.info.json"
            info = traces.parse_info(traces.load_json(info_file, traces.INFO_CAP, 10_000, root=launch_dir))
            got.nvml = info.get("nvlink")
        except traces.TraceError:
            pass  # the call's NVML count is a complement; ncu's log says what went wrong
        try:
            got.ncu = ncu_csv.read(folder / f"r{rank}.ncu.csv", metrics, root=launch_dir)
        except traces.TraceError as exc:
            got.error = str(exc)
        out.append(got)
    return out


# ---------------------------------------------------------------- counters -> figures


def kernel_key(name: str) -> str:
    """A kernel's name as ncu and CUPTI both give it, for matching: cut as traces cut it, no `void `."""
    return name[: traces.NAME_CHARS].removeprefix("void ").strip()


def function_name(name: str) -> str:
    """A kernel's function name without namespaces, template arguments or parameters: what ncu prints
    where it names kernels by function only."""
    return re.split(r"[<(]", kernel_key(name), maxsplit=1)[0].strip().rsplit("::", 1)[-1]


@dataclass
class Measurement:
    """A side's NVLink figures, the kernel categories its timing figures take, and each counted
    kernel's bound by (rank, name)."""

    profile: NvlinkProfile
    measured: dict[str, str] = field(default_factory=dict)
    bounds: dict[tuple[int, str], str] = field(default_factory=dict)


def _per_call(nvml: dict[str, Any] | None) -> tuple[int, int] | None:
    if not nvml or not nvml.get("calls"):
        return None
    return nvml["tx_bytes"] // nvml["calls"], nvml["rx_bytes"] // nvml["calls"]


def _threshold(moved: int) -> float:
    return max(COMM_MIN_BYTES, COMM_SHARE * moved)


def _rate(moved: int, ms: float | None, limits: Ceilings) -> tuple[float | None, float | None]:
    if ms is None or ms <= 0:
        return None, None
    gbps = moved / (ms * 1e-3) / 1e9
    return round(gbps, 1), round(100 * gbps / limits.nvlink_gbps, 1)


def _median_work(figures: traces.SideFigures, j: int) -> list[tuple[traces.Event, str]]:
    if not figures.calls:
        return []
    return figures.calls[figures.median_call][j].work


def _durations(work: list[tuple[traces.Event, str]]) -> dict[str, list[traces.Event]]:
    """The call's kernels by full name and by function name, each in order of start."""
    out: dict[str, list[traces.Event]] = defaultdict(list)
    for e, _ in sorted(work, key=lambda w: w[0].ts):
        if e.cat == "kernel":
            out[kernel_key(e.name)].append(e)
            out["fn:" + function_name(e.name)].append(e)
    return out


def _kernel_bytes(row: ncu_csv.KernelRow) -> tuple[int, int, int | None]:
    m = row.metrics
    rx = m.get(RX_USER, m.get(RX, 0.0))
    tx = m.get(TX_USER, m.get(TX, 0.0))
    peer = m.get(PEER_SECTORS)
    return int(tx), int(rx), int(peer * SECTOR_BYTES) if peer is not None else None


def _bound(row: ncu_csv.KernelRow, moved: int, ms: float | None, limits: Ceilings) -> str:
    """NVLink, HBM or compute where the kernel runs at BOUND_PCT of that ceiling or more, else ''."""
    m = row.metrics
    _, pct = _rate(moved, ms, limits)
    if pct is not None and pct >= BOUND_PCT:
        return "NVLink"
    if DRAM in m and ms and 100 * m[DRAM] / (ms * 1e-3) / 1e9 / limits.hbm_gbps >= BOUND_PCT:
        return "HBM"
    if m.get(SM_PCT, 0.0) >= BOUND_PCT:
        return "compute"
    return ""


def _rank_ncu(
    rank: int, work: list[tuple[traces.Event, str]], got: RankCounters, limits: Ceilings, out: Measurement
) -> tuple[list[KernelBytes], RankBytes]:
    """One rank's counted kernels: which communicated, how, how fast; and its bytes per call."""
    assert got.ncu is not None
    rows = got.ncu.kernels
    timed = _durations(work)
    seen: dict[str, int] = defaultdict(int)
    sums = [0, 0]
    per_kernel = []
    for row in rows:
        tx, rx, peer = _kernel_bytes(row)
        sums[0] += tx
        sums[1] += rx
        key = kernel_key(row.name)
        if key not in timed:  # ncu named it by function only, or differently: match the function name
            key = "fn:" + function_name(row.name)
        events = timed.get(key, [])
        k = seen[key]
        seen[key] += 1
        event = events[k] if k < len(events) else None
        per_kernel.append((row, tx, rx, peer, event))
    call = _per_call(got.nvml)
    moved = max(call) if call else max(sums)
    limit = _threshold(moved)
    kernels = []
    for row, tx, rx, peer, event in per_kernel:
        ms = event.dur / 1e3 if event is not None else row.metrics.get(DURATION, 0.0) / 1e6 or None
        name = event.name if event is not None else row.name
        out.bounds[(rank, name)] = _bound(row, max(tx, rx), ms, limits)
        nccl = bool(NCCL.search(row.name))
        if peer is not None:
            communicates = peer >= limit or (nccl and max(tx, rx) >= limit)
        else:
            communicates = max(tx, rx) >= limit
        if not communicates:
            continue
        mechanism = "nccl" if nccl else "sm" if peer is not None and peer >= limit else "unattributed"
        by_name = traces.category(event) if event is not None else "compute"
        category = "both" if by_name == "compute" else "comm"
        if event is not None:
            out.measured[event.name] = category
        gbps, pct = _rate(max(tx, rx), ms, limits)
        kernels.append(
            KernelBytes(
                rank=rank,
                name=name[:120],
                mechanism=mechanism,
                category=category,
                tx_bytes=tx,
                rx_bytes=rx,
                peer_bytes=peer,
                ms=round(ms, 4) if ms else None,
                gbps=gbps,
                pct_of_ceiling=pct,
                timed_by="trace" if event is not None else "ncu",
                source="ncu",
            )
        )
    kernels += _copy_engine(rank, work, call, sums, limit, limits)
    total = RankBytes(rank=rank, tx_bytes=call[0], rx_bytes=call[1], source="nvml") if call else None
    return kernels, total or RankBytes(rank=rank, tx_bytes=sums[0], rx_bytes=sums[1], source="ncu")


def _copy_engine(
    rank: int,
    work: list[tuple[traces.Event, str]],
    call: tuple[int, int] | None,
    sums: list[int],
    limit: float,
    limits: Ceilings,
) -> list[KernelBytes]:
    """The call's NVML bytes beyond its kernels', given to its peer or device-to-device copies."""
    copies = [e for e, _ in work if e.cat == "gpu_memcpy" and PEER_COPY.search(e.name)]
    if call is None or not copies:
        return []
    tx, rx = max(call[0] - sums[0], 0), max(call[1] - sums[1], 0)
    if max(tx, rx) < limit:
        return []
    ms = sum(e.dur for e in copies) / 1e3
    gbps, pct = _rate(max(tx, rx), ms, limits)
    name, mechanism = " + ".join(sorted({e.name for e in copies}))[:120], "copy_engine"
    timed: float | None = round(ms, 4)
    if pct is not None and pct > IMPOSSIBLE_PCT:  # not these copies' bytes: no mechanism, no rate
        name, mechanism, timed, gbps, pct = REMAINDER, "unattributed", None, None, None
    return [
        KernelBytes(
            rank=rank,
            name=name,
            mechanism=mechanism,
            category="comm",
            tx_bytes=tx,
            rx_bytes=rx,
            ms=timed,
            gbps=gbps,
            pct_of_ceiling=pct,
            source="ncu+nvml",
        )
    ]


def _rank_nvml(
    rank: int, work: list[tuple[traces.Event, str]], call: tuple[int, int], limits: Ceilings
) -> tuple[list[KernelBytes], str | None]:
    """A rank's call bytes (NVML) given to the one operation named for communication in its median
    call, when there is exactly one such name; else no kernel, and a note where bytes went unnamed."""
    comm = [e for e, c in work if c in traces.COMMUNICATING]
    names = sorted({e.name for e in comm})
    moved = max(call)
    if moved < COMM_MIN_BYTES:
        return [], None
    if not names:
        return [], (
            f"rank {rank}: {_mib(moved)} crossed NVLink per call and no operation of the call is named for "
            "communication: a kernel communicates that its name hides"
        )
    if len(names) > 1:
        return [], None
    e0 = comm[0]
    mechanism = (
        "copy_engine"
        if e0.cat == "gpu_memcpy"
        else "nccl"
        if NCCL.search(e0.name)
        else "unattributed"  # SM loads and stores or TMA: the names cannot tell
    )
    ms = sum(e.dur for e in comm) / 1e3
    gbps, pct = _rate(moved, ms, limits)
    kernel = KernelBytes(
        rank=rank,
        name=names[0][:120],
        mechanism=mechanism,
        category="comm",
        tx_bytes=call[0],
        rx_bytes=call[1],
        ms=round(ms, 4),
        gbps=gbps,
        pct_of_ceiling=pct,
        source="nvml",
    )
    return [kernel], None


def _method(
    figures: traces.SideFigures,
    nvml: dict[int, tuple[int, int] | None],
    counted: list[RankCounters] | None,
    counted_why: str,
) -> tuple[Method, str]:
    """The best method every rank of the side had, and why not a better one."""
    if not figures.ranks:
        return "names", "no rank's trace was read"
    by_rank = {c.rank: c for c in counted or []}
    missing_ncu = [r for r in figures.ranks if r not in by_rank or by_rank[r].ncu is None]
    if counted is not None and not missing_ncu:
        return "ncu", ""
    why = counted_why
    if counted is not None and missing_ncu:
        first = by_rank.get(missing_ncu[0])
        why = f"rank {missing_ncu[0]}'s counters: {first.error if first and first.error else 'none written'}"
    if all(nvml.get(r) is not None for r in figures.ranks):
        return "nvml", why
    return "names", why


def measure(
    figures: traces.SideFigures,
    side_traces: list[traces.RankTrace],
    counted: list[RankCounters] | None,
    counted_why: str,
    floor_bytes: float | None,
    limits: Ceilings,
) -> Measurement:
    """A side's NVLink figures (docs/nvlink-counters.md) from its trace launch (`figures`,
    `side_traces`: NVML's counts in the info files) and its counter launch (`counted`, None when there
    was none, with `counted_why`)."""
    info = {t.rank: t.info for t in side_traces}
    nvml = {r: _per_call(info.get(r, {}).get("nvlink")) for r in figures.ranks}
    method, why = _method(figures, nvml, counted, counted_why)
    if method == "names":
        whys = [info.get(r, {}).get("nvlink_why") for r in figures.ranks]
        nvml_why = next((w for w in whys if w), "")
        if nvml_why and nvml_why != why:
            why = "; ".join(w for w in (why, f"NVML: {nvml_why}") if w)
    out = Measurement(NvlinkProfile(method=method, why=why[:400], ceiling_gbps=limits.nvlink_gbps))
    out.profile.ceiling = limits.source
    out.profile.floor_bytes = floor_bytes
    by_rank = {c.rank: c for c in counted or []}
    kernels: list[KernelBytes] = []
    for j, rank in enumerate(figures.ranks):
        work = _median_work(figures, j)
        if method == "ncu":
            got = by_rank[rank]
            if nvml.get(rank) is not None:  # the unreplayed launch's count is the call's
                got = RankCounters(rank, got.ncu, info[rank]["nvlink"], got.error)
            found, total = _rank_ncu(rank, work, got, limits, out)
            kernels += found
            out.profile.ranks.append(total)
        elif method == "nvml":
            call = nvml[rank]
            assert call is not None
            found, note = _rank_nvml(rank, work, call, limits)
            kernels += found
            out.profile.notes += [note] if note else []
            out.profile.ranks.append(RankBytes(rank=rank, tx_bytes=call[0], rx_bytes=call[1], source="nvml"))
    if method == "ncu":
        passes = [c.ncu.passes for c in by_rank.values() if c.ncu is not None and c.ncu.passes]
        out.profile.passes = max(passes) if passes else None
        if any(PEER_SECTORS not in row.metrics for c in by_rank.values() if c.ncu for row in c.ncu.kernels):
            out.profile.notes.append(
                "the peer-memory sector counter was missing: a kernel counts as communicating by the "
                "GPU's NVLink bytes while it ran, peers' traffic included"
            )
    kernels.sort(key=lambda k: -max(k.tx_bytes, k.rx_bytes))
    out.profile.kernels = kernels[:SHOWN_KERNELS]
    if floor_bytes and out.profile.ranks:
        moved = [max(r.tx_bytes, r.rx_bytes) for r in out.profile.ranks]
        out.profile.moved_vs_floor = round(statistics.fmean(moved) / floor_bytes, 3)
    return out


# ---------------------------------------------------------------- findings

MECHANISM_WORDS = {
    "nccl": "by NCCL's kernel",
    "sm": "by SM loads and stores to peer memory",
    "copy_engine": "by the copy engine",
    "unattributed": "(its source not told apart: TMA, or peers' accesses)",
}


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def _short(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


def _bottleneck(figures: traces.SideFigures) -> tuple[int, str, float, float] | None:
    """(rank, kernel, its ms, the call's ms) of the longest device operation by name in the slowest
    rank's median call."""
    if not figures.calls or not figures.on_gpu:
        return None
    call = figures.calls[figures.median_call]
    j = max(range(len(call)), key=lambda i: call[i].window_us)
    spent: dict[str, float] = defaultdict(float)
    for e, _ in call[j].work:
        if e.on_device:
            spent[e.name] += e.dur
    if not spent:
        return None
    name = max(spent, key=lambda n: spent[n])
    return figures.ranks[j], name, spent[name] / 1e3, call[j].window_us / 1e3


def findings(label: str, m: Measurement, figures: traces.SideFigures) -> list[str]:
    """What an agent reads about a side's NVLink figures (docs/nvlink-counters.md)."""
    p = m.profile
    out: list[str] = []
    if p.ranks:
        tx = statistics.fmean(r.tx_bytes for r in p.ranks)
        rx = statistics.fmean(r.rx_bytes for r in p.ranks)
        floor = (
            f", {p.moved_vs_floor:.3g}x the traffic model's floor of {_mib(p.floor_bytes)} each way"
            if p.moved_vs_floor is not None and p.floor_bytes
            else ""
        )
        out.append(
            f"{label}: NVLink carried {_mib(tx)} out and {_mib(rx)} in per call and rank ({p.method}){floor}"
        )
    firsts: dict[str, KernelBytes] = {}  # the kernel that moved most, of each mechanism
    for kernel in p.kernels:
        firsts.setdefault(kernel.mechanism, kernel)
    for k in firsts.values():
        speed = ""
        if k.gbps is not None and k.pct_of_ceiling is not None and p.ceiling_gbps:
            ceiling = f"{p.ceiling_gbps:.4g} GB/s"
            speed = f" at {k.gbps:.4g} GB/s, {k.pct_of_ceiling:.0f}% of the NVLink ceiling ({ceiling})"
        moved = f"{_mib(k.tx_bytes)} out and {_mib(k.rx_bytes)} in"
        how = MECHANISM_WORDS.get(k.mechanism, k.mechanism)
        out.append(f"{label}: rank {k.rank}'s {_short(k.name)} moved {moved} {how}{speed}")
    for name in sorted({k.name for k in p.kernels if k.category == "both"}):
        out.append(
            f"{label}: {_short(name)} communicates (counted) and computes (by name): shown as both, so its "
            "overlap is its own"
        )
    out += [f"{label}: {note}" for note in p.notes]
    worst = _bottleneck(figures)
    if worst is not None:
        rank, name, ms, call_ms = worst
        bound = m.bounds.get((rank, name)) if p.method == "ncu" else None
        if bound:
            how = f"{bound}-bound"
        elif bound == "":
            how = "not near a counted ceiling (latency, synchronisation or launch bound, or not counted)"
        else:
            how = f"its bound is not measured ({p.method}{': ' + p.why if p.why else ''})"
        share = f"{ms:.4g} ms of rank {rank}'s {call_ms:.4g} ms call"
        out.append(f"{label}: the bottleneck is {_short(name)}, {share}: {how}")
    return out
