"""Sandboxes started ahead of need, each used for exactly one launch.

Most of a cold launch's wall time is each rank importing torch, creating its CUDA context and its NCCL
communicators. A warm sandbox has done all that before its launch exists: its launcher waits for the
launch file (harness/launch.py, `--warm`). When a launch of the same shape (device, GPUs, world size,
threads) is dispatched, it takes a warm sandbox instead of starting one; the pool then starts a
replacement. A sandbox never serves a second launch, so nothing a candidate leaves behind reaches
another one. Nothing secret is known when a sandbox starts: seeds arrive with the launch.

Benchmarks must have the GPUs to themselves. A sandbox of a GPU shape warms up in two steps (`gated`):
what needs only the CPU (the container, torch imported: each rank writes rank{r}.staged), then, once
the pool opens it (GO_NAME in its launch directory, or its launch), what needs the GPUs (the CUDA
context, the communicators, one collective: rank{r}.ready). While a benchmark times (`quiet(key,
count)`), sandboxes still start and take their first step, as builds run beside it, but none is
opened except the `count` that the benchmark's own launches need; on entry it waits (`settle`) for
every opened sandbox still warming up. A CPU shape's sandboxes are not gated: there, warming up takes
the cores the benchmark runs on, so none starts while it times. A benchmark of several launches a side
has a sandbox started for each of its launches first (`replenish(key, count)`), so that none of them
starts cold while the other side is timed.

Of a GPU shape the pool also keeps `spare` sandboxes staged but closed: they hold no GPU memory, and
when launches take more than `per_key` at once (a check's three, then a benchmark's two), the next
ones need only their GPU step. A staged sandbox is opened as soon as fewer than `per_key` of its
shape are open and untaken.

A shape of world size 0 is a tool sandbox (harness/launch.py): no ranks and no GPU; its launcher
imports torch and the build program ahead of a build launch. It is ready as soon as it runs, and
does not count among the `max_keys` shapes of ranks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

import sandbox.base as base
from harness.contracts import GO_NAME, READY_STEPS
from sandbox.base import tail, warm_setup

log = structlog.get_logger("sandbox.pool")

GATED_DEVICES = frozenset({"cuda"})  # whose sandboxes warm up in two steps (below)
SETTLE_S = 120.0
WATCH_S = 0.01  # how often a gated sandbox's files are looked at while it warms up
EXPIRY_MARGIN_S = 30.0  # a sandbox this close to exiting on its own (base.WARM_IDLE_S) is not handed out
READY_BYTES = 512  # a rank's ready file (its GPU step's times) is read up to this size, else not at all


@dataclass(frozen=True)
class WarmKey:
    device: str
    gpus: tuple[int, ...]
    world_size: int  # 0: a tool sandbox (harness/launch.py: a build launch, torch imported ahead)
    threads: int
    cpus: tuple[tuple[int, ...], ...] = ()  # each rank's CPU cores (sandbox/cpus.py); () = not pinned

    @property
    def gated(self) -> bool:
        """Whether its sandboxes use the GPUs only once opened (a GPU shape)."""
        return self.device in GATED_DEVICES


@dataclass
class WarmSlot:
    key: WarmKey
    launch_id: str
    launch_dir: Path
    handle: Any = None
    started: float = field(default_factory=time.monotonic)
    # when its start returned (the engine runs it); a gated sandbox's: when the pool saw its ranks
    # staged, opened it, and saw them ready (monotonic)
    running_at: float | None = None
    staged_at: float | None = None
    opened_at: float | None = None
    ready_at: float | None = None
    # the slowest rank's seconds for each part of the GPU step, as its ranks wrote them (`step_times`)
    steps: dict[str, float] = field(default_factory=dict)

    def ready(self) -> bool:
        return self._all("ready")

    def staged(self) -> bool:
        return self._all("staged")

    def _all(self, step: str) -> bool:
        return all((self.launch_dir / f"rank{r}.{step}").exists() for r in range(self.key.world_size))

    def open(self) -> None:
        """Let its ranks use the GPUs (their launcher sends them the go line)."""
        if self.opened_at is None:
            (self.launch_dir / GO_NAME).touch()
            self.opened_at = time.monotonic()

    def warming_gpus(self) -> bool:
        """Whether it may be using the GPUs to warm up now (a CPU shape's sandbox: warming up at all)."""
        return (not self.key.gated or self.opened_at is not None) and not self.ready()

    def readiness(self) -> int:
        """0 ready, 1 warming up on the GPUs, 2 staged, 3 earlier: which one a launch should take."""
        if self.ready():
            return 0
        if self.opened_at is not None:
            return 1
        return 2 if self.key.gated and self.staged() else 3

    def times(self) -> dict[str, Any]:
        """When it ran, staged, was opened and was ready, in seconds from its start (as far as seen),
        and what its GPU step took (`step_times`), where its ranks said."""
        steps = (
            ("running", self.running_at),
            ("staged", self.staged_at),
            ("opened", self.opened_at),
            ("ready", self.ready_at),
        )
        times: dict[str, Any] = {
            f"{name}_s": None if t is None else round(t - self.started, 2) for name, t in steps
        }
        if self.steps:
            times["gpu_step"] = dict(self.steps)
        return times

    def step_times(self) -> dict[str, float]:
        """Each part of the GPU step (contracts.READY_STEPS) at its slowest rank, from the ranks' ready
        files: written inside the sandbox, so read with limits, and a part any rank leaves out or
        gives as anything but seconds is left out."""
        said = [_read_steps(self.launch_dir / f"rank{r}.ready") for r in range(self.key.world_size)]
        return {
            name: max(ranks[name] for ranks in said)
            for name in READY_STEPS
            if said and all(name in ranks for ranks in said)
        }


def _read_steps(path: Path) -> dict[str, float]:
    """What a rank's ready file says, if it is a plain file (not a link, nor a pipe that would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        data = os.read(fd, READY_BYTES + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        said = json.loads(data) if 0 < len(data) <= READY_BYTES else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(said, dict):
        return {}
    return {
        k: round(float(v), 3)
        for k, v in said.items()
        if k in READY_STEPS
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and 0 <= v <= base.WARM_IDLE_S
    }


class WarmPool:
    """Up to `per_key` warm sandboxes (a number, or one for each shape) for each of the `max_keys` most
    recently used launch shapes, and of a gated shape `spare` more, staged but not opened.

    `start(slot)` starts a sandbox for the slot and returns its handle; `alive(handle)` says whether
    it still runs; `discard(slot)` stops it and removes what it left; `describe(slot)` says how a
    sandbox that is no longer alive ended (exit status, its launcher's last lines).
    """

    def __init__(
        self,
        new_dir: Callable[[str], Path],
        start: Callable[[WarmSlot], Any],
        alive: Callable[[Any], bool],
        discard: Callable[[WarmSlot], None],
        describe: Callable[[WarmSlot], str] = lambda slot: "",
        per_key: int | Callable[[WarmKey], int] = 2,
        max_keys: int = 2,
        spare: int | Callable[[WarmKey], int] = 0,
    ):
        self._new_dir, self._start, self._alive, self._discard = new_dir, start, alive, discard
        self._describe = describe
        self.per_key, self.max_keys, self.spare = per_key, max_keys, spare
        self._lock = threading.Condition()
        self._slots: OrderedDict[WarmKey, list[WarmSlot]] = OrderedDict()
        self._starting = 0
        self._starting_for: dict[WarmKey, int] = {}
        self._quiet = 0
        self._reserved: dict[WarmKey, int] = {}  # while quiet: how many more the benchmark's launches need
        self._pending: set[WarmKey] = set()
        self._closed = False

    def take(self, key: WarmKey) -> WarmSlot | None:
        """A live warm sandbox of this shape, the furthest warmed up (`WarmSlot.readiness`), or None;
        the shape becomes the most recently used. One still warming up is better than none: its
        launch starts as soon as it is ready, sooner than a cold start (a gated one is opened by the
        launch itself)."""
        stale: list[WarmSlot] = []
        with self._lock:
            slots = self._slots.setdefault(key, [])
            self._slots.move_to_end(key)
            live: list[WarmSlot] = []
            for slot in slots:
                (live if self._alive(slot.handle) and not self._expiring(slot) else stale).append(slot)
            taken = min(live, key=WarmSlot.readiness) if live else None  # the first of the best
            self._slots[key] = [s for s in live if s is not taken]
        for slot in stale:
            self._report_stale(slot)
            self._discard(slot)
        log.info(
            "warm.take",
            hit=taken is not None,
            ready=taken.ready() if taken is not None else None,
            age_s=round(time.monotonic() - taken.started, 1) if taken is not None else None,
            stale=len(stale),
            world_size=key.world_size,
            **(taken.times() if taken is not None and key.gated else {}),
        )
        return taken

    @staticmethod
    def _expiring(slot: WarmSlot) -> bool:
        return time.monotonic() - slot.started >= base.WARM_IDLE_S - EXPIRY_MARGIN_S

    def _report_stale(self, slot: WarmSlot) -> None:
        age = time.monotonic() - slot.started
        if self._expiring(slot):
            log.info("warm.expired", launch=slot.launch_id, age_s=round(age, 1))
            return
        # it died early: what its ranks wrote says why
        logs = {r: tail(slot.launch_dir / f"rank{r}.log", 1500) for r in range(slot.key.world_size)}
        try:
            ended = self._describe(slot)
        except Exception as exc:  # a diagnosis must never turn into a failure of the launch
            ended = f"(could not tell: {exc!r})"
        log.warning(
            "warm.died",
            launch=slot.launch_id,
            age_s=round(age, 1),
            was_ready=slot.ready(),
            ended=ended[-2000:],
            rank_logs=logs,
        )

    def discard(self, slot: WarmSlot) -> None:
        """Stop a sandbox taken from the pool that will serve no launch."""
        self._discard(slot)

    def wanted(self, key: WarmKey) -> int:
        """How many sandboxes of this shape the pool keeps warm (of a gated shape: open)."""
        return self.per_key(key) if callable(self.per_key) else self.per_key

    def spares(self, key: WarmKey) -> int:
        """How many more of a gated shape the pool keeps staged but closed."""
        if not key.gated:
            return 0
        return self.spare(key) if callable(self.spare) else self.spare

    def replenish(self, key: WarmKey, count: int = 0) -> None:
        """Start sandboxes of this shape up to `per_key` (and its spares), or up to `count` when that
        is more (a benchmark of several launches a side wants one for each), in the background (while
        quiet, a CPU shape's only later)."""
        with self._lock:
            if self._closed:
                return
            if self._quiet and not key.gated:
                self._pending.add(key)
                return
            self._slots.setdefault(key, [])
            self._slots.move_to_end(key)
            evicted: list[WarmSlot] = []
            # the least recently used shapes of ranks go; tool sandboxes (no GPU) are not counted
            ranked = [k for k in self._slots if k.world_size]
            for old_key in ranked[: max(len(ranked) - self.max_keys, 0)]:
                evicted.extend(self._slots.pop(old_key))
            kept = self.wanted(key) + self.spares(key)
            missing = max(kept, count) - len(self._slots[key]) - self._starting_for.get(key, 0)
            self._starting += max(missing, 0)
            self._starting_for[key] = self._starting_for.get(key, 0) + max(missing, 0)
        for slot in evicted:
            self._discard(slot)
        for _ in range(max(missing, 0)):
            threading.Thread(target=self._start_one, args=(key,), daemon=True).start()

    def _start_one(self, key: WarmKey) -> None:
        launch_id = uuid.uuid4().hex[:16]
        slot = WarmSlot(key=key, launch_id=launch_id, launch_dir=self._new_dir(launch_id))
        try:
            slot.handle = self._start(slot)
            slot.running_at = time.monotonic()
            started = True
        except Exception as exc:
            log.warning("warm.start_failed", launch=launch_id, error=repr(exc)[:500])
            started = False
        with self._lock:
            keep = started and not self._closed and key in self._slots
            if keep:
                self._slots[key].append(slot)
        if not keep:
            self._discard(slot)
        with self._lock:  # only now: `close` waits until no start is in flight, discards included
            self._starting -= 1
            self._starting_for[key] -= 1
            self._lock.notify_all()
        if keep and key.gated:
            self._watch(slot)

    def _watch(self, slot: WarmSlot) -> None:
        """Open a gated sandbox once its ranks have staged, unless a benchmark is timing and has not
        reserved it (then as soon as it ends); note when it staged and when it was ready. Ends when
        it is ready, taken, discarded or about to expire."""
        while time.monotonic() - slot.started < base.WARM_IDLE_S:
            with self._lock:
                if self._closed or slot not in self._slots.get(slot.key, ()):
                    return
                if slot.staged_at is None and slot.staged():
                    slot.staged_at = time.monotonic()
                if slot.staged_at is not None and slot.opened_at is None and self._may_open(slot.key):
                    slot.open()
            if slot.ready():
                slot.ready_at = time.monotonic()
                slot.steps = slot.step_times()
                return
            time.sleep(WATCH_S)

    def _may_open(self, key: WarmKey) -> bool:
        """Whether a staged sandbox of this shape may use the GPUs now (under the lock): while a
        benchmark times, only those it reserved; else while fewer than `per_key` are open."""
        if self._quiet:
            if self._reserved.get(key, 0) > 0:
                self._reserved[key] -= 1
                return True
            return False
        return sum(s.opened_at is not None for s in self._slots.get(key, ())) < self.wanted(key)

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Return once no sandbox is warming up on the GPUs, or is about to: none opened and not yet
        ready, none that a quiet block reserved still to come; of a CPU shape, none starting or warming
        up at all (or at the timeout)."""
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            with self._lock:
                busy = self._busy()
            if not busy:
                return
            time.sleep(0.02)

    def _busy(self) -> bool:
        starting = any(n > 0 and not key.gated for key, n in self._starting_for.items())
        warming = any(
            s.warming_gpus() and self._alive(s.handle) for slots in self._slots.values() for s in slots
        )
        to_come = any(
            n > 0
            and (
                self._starting_for.get(key, 0) > 0
                or any(s.opened_at is None and self._alive(s.handle) for s in self._slots.get(key, ()))
            )
            for key, n in self._reserved.items()
        )
        return starting or warming or to_come

    @contextlib.contextmanager
    def quiet(self, key: WarmKey | None = None, count: int = 0) -> Iterator[None]:
        """A benchmark is timing inside this block: no sandbox uses the GPUs to warm up, except `count`
        of shape `key` for its own launches, which are ready (as far as there are sandboxes of that
        shape) before the block begins; no CPU-shape sandbox starts. What was held back starts after."""
        with self._lock:
            self._quiet += 1
            if key is not None and key.gated:
                opened = sum(s.opened_at is not None for s in self._slots.get(key, ()))
                self._reserved[key] = max(0, count - opened)
        self.settle()
        try:
            yield
        finally:
            with self._lock:
                self._quiet -= 1
                pending = list(self._pending) if not self._quiet else []
                if not self._quiet:
                    self._pending.clear()
                    self._reserved.clear()
            for k in pending:
                self.replenish(k)

    def close(self, timeout_s: float = SETTLE_S) -> None:
        """Stop every warm sandbox, waiting for those still starting, and remove what they left."""
        with self._lock:
            self._closed = True
            slots = [s for group in self._slots.values() for s in group]
            self._slots.clear()
        for slot in slots:
            self._discard(slot)
        give_up = time.monotonic() + timeout_s
        with self._lock:
            while self._starting > 0 and (left := give_up - time.monotonic()) > 0:
                self._lock.wait(left)

    def size(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._slots.values())


class Pooled:
    """What both backends share to keep warm sandboxes (a mixin before sandbox.backend.Backend, whose
    `enable_pool` and `disable_pool` it provides): each defines `_start` (start a sandbox, warm when
    given a set-up), `_alive(handle)`, `_discard(slot)` and `_describe(slot)`."""

    pool: WarmPool | None = None
    _harness_root: Path | None = None

    def enable_pool(
        self,
        new_dir: Callable[[str], Path],
        harness_root: Path,
        per_key: int | Callable[[WarmKey], int] = 2,
        spare: int | Callable[[WarmKey], int] = 0,
    ) -> WarmPool:
        """Keep sandboxes started ahead of need, `per_key` of each launch shape and `spare` staged
        more of a GPU shape (WarmPool)."""
        if self.pool is None:
            self._harness_root = harness_root
            self.pool = WarmPool(
                new_dir,
                self._start_warm,
                self._alive,  # type: ignore[attr-defined]
                self._discard,  # type: ignore[attr-defined]
                self._describe,  # type: ignore[attr-defined]
                per_key=per_key,
                spare=spare,
            )
        return self.pool

    def disable_pool(self) -> None:
        """Stop every warm sandbox; launches start cold again (a batch that kept them has ended)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _start_warm(self, slot: WarmSlot) -> Any:
        k = slot.key
        assert self._harness_root is not None
        setup = warm_setup(slot.launch_dir, k.world_size, k.device, k.threads, k.cpus, gated=k.gated)
        return self._start(  # type: ignore[attr-defined]
            slot.launch_id,
            slot.launch_dir,
            k.device,
            list(k.gpus),
            k.threads,
            k.cpus,
            self._harness_root,
            setup,
        )
