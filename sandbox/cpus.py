"""Which CPU cores each rank of a launch may run on (stdlib only).

The node's cores are split into one block per GPU, whole physical cores at a time (a core's
hyperthreads stay in one block), in the order Linux numbers them. Rank r of a GPU launch runs on the
block of its GPU, and every thread it starts (CUDA's, NCCL's proxy threads, the solution's) inherits
that. So the processes of launches on disjoint GPU sets never share a core, and a rank lands on the same
cores in every launch instead of wherever the kernel put it (docs/measurement.md, "Why a side is timed
in separate launches"). A CPU launch's ranks get one block each out of `world_size`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> '0-3,8,10-11' (the kernel's cpulist format)."""
    parts: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def _siblings(cpu: int) -> list[int]:
    try:
        return parse_cpulist((SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
    except (OSError, ValueError):
        return [cpu]


def physical_cores(cpus: Iterable[int], siblings: Callable[[int], list[int]] = _siblings) -> list[list[int]]:
    """`cpus` grouped by physical core (hyperthread siblings together), ordered by lowest CPU id."""
    allowed = sorted(set(cpus))
    seen: set[int] = set()
    cores: list[list[int]] = []
    for cpu in allowed:
        if cpu in seen:
            continue
        group = sorted({cpu, *(s for s in siblings(cpu) if s in allowed)})
        seen.update(group)
        cores.append(group)
    return cores


def blocks(n: int, cpus: Iterable[int], siblings: Callable[[int], list[int]] = _siblings) -> list[list[int]]:
    """`cpus` split into `n` blocks of consecutive physical cores, as even as whole cores allow.

    With fewer physical cores than blocks the split is by logical CPU; with fewer logical CPUs than
    blocks, block i gets CPU i modulo their number (blocks then share CPUs: nothing better exists)."""
    if n < 1:
        raise ValueError(f"need at least one block, not {n}")
    cores = physical_cores(cpus, siblings)
    if len(cores) < n:
        cores = [[c] for group in cores for c in group]
    if not cores:
        raise ValueError("no CPU to split")
    if len(cores) < n:
        return [cores[i % len(cores)] for i in range(n)]
    out: list[list[int]] = []
    start = 0
    for i in range(n):
        end = start + (len(cores) - start) // (n - i)
        out.append(sorted(c for group in cores[start:end] for c in group))
        start = end
    return out


def rank_cpus(
    device: str,
    gpus: list[int],
    world_size: int,
    node_gpus: int,
    available: Iterable[int] | None = None,
    siblings: Callable[[int], list[int]] = _siblings,
) -> tuple[tuple[int, ...], ...]:
    """The CPUs of each rank: the block of its GPU out of `node_gpus` blocks (GPU launches), or block r
    out of `world_size` (CPU launches). `available` defaults to the CPUs this process may use."""
    cpus = list(available) if available is not None else sorted(os.sched_getaffinity(0))
    if device == "cuda":
        if len(gpus) != world_size or not gpus or max(gpus) >= node_gpus:
            raise ValueError(f"GPUs {gpus} do not fit world size {world_size} on a node of {node_gpus}")
        split = blocks(node_gpus, cpus, siblings)
        return tuple(tuple(split[g]) for g in gpus)
    return tuple(tuple(b) for b in blocks(world_size, cpus, siblings))


def union(cpus: tuple[tuple[int, ...], ...]) -> str:
    """Every CPU of the launch, in the cpulist format Docker's cpuset takes ('' when not pinned)."""
    return ",".join(str(c) for c in sorted({c for block in cpus for c in block}))
