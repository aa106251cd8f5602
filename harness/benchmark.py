"""A benchmark launch on this rank: its input sets, their judged first calls, the fresh input sets,
and the timed calls (harness/timing.py); returns the timing record rank 0 writes (torch + stdlib
only)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from harness.calls import Calls, Pristine, input_tensors, normalize_output, snapshot
from harness.contracts import TimingConfig, TimingRecord


def input_rotation(sets: list[tuple]) -> Callable[[], list[int]] | None:
    """A function that moves every set's tensors one set along (set i's buffers get set i+1's data,
    in place, so the addresses stay) and returns which set's data each buffer then holds; None when
    the sets differ in anything but values (then no two sets share one judged output)."""
    import torch

    tensors = [[t for t in s if isinstance(t, torch.Tensor)] for s in sets]
    others = [[a for a in s if not isinstance(a, torch.Tensor)] for s in sets]
    try:
        same = all(o == others[0] for o in others)
    except Exception:  # a non-tensor argument without a usable ==
        same = False
    same = same and all(
        len(ts) == len(tensors[0])
        and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.is_contiguous()
            for a, b in zip(ts, tensors[0], strict=True)
        )
        for ts in tensors
    )
    if not same or len(sets) < 2 or not tensors[0]:
        return None
    holds = list(range(len(sets)))

    def rotate() -> list[int]:
        with torch.no_grad():
            first = [t.clone() for t in tensors[0]]
            for b in range(len(tensors) - 1):
                for dst, src in zip(tensors[b], tensors[b + 1], strict=True):
                    dst.copy_(src)
            for dst, src in zip(tensors[-1], first, strict=True):
                dst.copy_(src)
        holds[:] = holds[1:] + holds[:1]
        return list(holds)

    return rotate


def copy_into(dst: tuple, src: tuple) -> bool:
    """Copy set `src`'s tensors into set `dst`'s buffers in place (their addresses stay) when the two
    differ in values only; False, and nothing copied, when they differ in anything else."""
    import torch

    if len(dst) != len(src):
        return False
    for a, b in zip(dst, src, strict=True):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return False
        if isinstance(a, torch.Tensor):
            if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device) or not a.is_contiguous():
                return False
        else:
            try:
                if a != b:
                    return False
            except Exception:  # a non-tensor argument without a usable ==
                return False
    with torch.no_grad():
        for a, b in zip(dst, src, strict=True):
            if isinstance(a, torch.Tensor):
                a.copy_(b)
    return True


def judged_fresh_calls(made: int, sure: int, wanted: int, pick: random.Random) -> list[int]:
    """Which of `made` fresh calls have their outputs judged: `wanted` of them (all when they fit),
    half at least among the first `sure`, which are always timed, so that a benchmark never ends with
    none judged; the rest over all of them, so that no stretch of fresh calls goes unwatched."""
    wanted = min(made, wanted)
    first = min(made, sure)
    early = pick.sample(range(first), min(first, max(1, (wanted + 1) // 2)))
    later = [k for k in range(made) if k not in early]
    return sorted(early + pick.sample(later, wanted - len(early)))


def fresh_calls(calls: Calls, label: str, base: int, max_calls: int, judged: set[int]) -> Any:
    """Timed calls on input sets never seen before (harness.timing.Fresh): fresh call k's inputs are
    made from the seed labelled k and copied into one set of fresh buffers, made once, so that their
    addresses stay the same from call to call (an honest solution that sets something up per address
    pays once, in the untimed warm-up call); the outputs of the calls in `judged` are saved for the
    host to judge, with the aliasing and mutation checks of a judged call."""
    from harness import timing
    from harness.context import derive_seed

    def make(k: Any) -> tuple:
        return calls.make(derive_seed(base, "fresh", label, k))

    # lean inputs: no set of fresh buffers beside the set made (the allocator tends to give the
    # next set the addresses the last one freed)
    buffers = None if calls.lean else make("buffers")
    state: dict[str, Any] = {}

    def prepare(k: int) -> None:
        state.clear()  # the last fresh set is freed before the next is made
        made = make("warmup" if k < 0 else k)
        copied = buffers is not None and copy_into(buffers, made)
        inputs = buffers if copied and buffers is not None else made
        state["inputs"] = inputs
        private = copied and not calls.mutates and not calls.lean
        # where the set was copied into the buffers, the set made is the pristine copy already
        state["pristine"] = Pristine(made, private=True) if private else calls.pristine(inputs)

    def call() -> Any:
        return calls.solution(*state["inputs"])

    def record(k: int, out: Any) -> None:
        if k not in judged:
            return
        inputs = list(state["inputs"])
        shape, outs = normalize_output(out)
        returned = len(outs)
        outs = calls.in_place(outs, tuple(inputs))
        pristine = state["pristine"]
        meta: dict[str, Any] = {"aliased_outputs": calls.aliasing(outs, inputs, returned)}
        meta["mutated_inputs"] = [] if pristine is None else pristine.changed(inputs)
        copies = [o.detach().clone() for o in outs]
        shape, copies = calls.judged_form(shape, copies, returned, inputs)
        calls.save(f"f{k}", copies, shape, meta)

    return timing.Fresh(prepare, call, record, max_calls)


def run(calls: Calls, enter: Callable[[str], str]) -> TimingRecord:
    """The benchmark mode; `enter(stage)` names each stage for the rank's status."""
    tcfg, base = calls.timing, calls.cfg["seeds"][0]
    enter("benchmark inputs")
    sets, nbytes = _input_sets(calls, tcfg, base)
    enter("benchmark first calls")
    judged: list[list] = []
    shapes: list = []
    for i, inputs in enumerate(sets):
        shape, outs, meta = calls.judge_call(snapshot(inputs) if calls.mutates else inputs)
        calls.save(f"s{i}", outs, shape, meta)
        judged.append(outs)  # private copies, taken at return
        shapes.append(shape)
    pristine = [Pristine(s, calls.lean_key) for s in sets] if not calls.mutates else None
    fresh, fresh_judged = _fresh(calls, tcfg, base, judged[0])
    enter("benchmark timing")
    record, holds = _timed(calls, sets, judged, shapes, fresh)
    if fresh is not None:
        record["fresh_timed"] = fresh.next
        record["fresh_judged"] = fresh_judged
        if tcfg.get("fresh_top_up"):
            # the reference's launch: outputs for every judged fresh seed a candidate's launch can reach
            for k in (k for k in fresh_judged if k >= fresh.next):
                fresh.prepare(k)
                fresh.record(k, fresh.call())
                calls.check("during a call")
    if pristine is not None:
        from harness import timing

        changed = [i for i, s in enumerate(sets) if pristine[holds[i]].changed(s)]
        flag = timing.max_over_ranks([1.0 if changed else 0.0], calls.device)[0]
        record["inputs_mutated_while_timing"] = bool(flag)
    record["per_set_bytes"] = nbytes
    return record


def _input_sets(calls: Calls, tcfg: TimingConfig, base: int) -> tuple[list[tuple], int]:
    """The replayed input sets: enough to cover twice the L2 (within max_sets and rotation_bytes),
    at least 2; and one set's bytes (the largest over ranks)."""

    from harness import timing
    from harness.context import derive_seed

    first = calls.make(derive_seed(base, "set", 0))
    nbytes = sum(t.numel() * t.element_size() for _, t in input_tensors(first))
    nbytes = int(timing.max_over_ranks([float(nbytes)], calls.device)[0])
    per_set = max(nbytes * (1 if calls.mutates else 2), 1)
    want = max(2, -(-2 * tcfg["l2_bytes"] // max(nbytes, 1)))
    n_sets = int(max(2, min(want, tcfg["max_sets"], tcfg["rotation_bytes"] // per_set)))
    if calls.lean:
        n_sets = 1  # lean inputs fill most of the memory: one replayed set, never rotated
    return [first] + [calls.make(derive_seed(base, "set", i)) for i in range(1, n_sets)], nbytes


def _fresh(calls: Calls, tcfg: TimingConfig, base: int, outputs: list) -> tuple[Any, list[int]]:
    """Fresh input sets, interleaved with the replayed ones (docs/measurement.md, "Replay
    advantage"): fresh_min to fresh_max of them; the outputs of as many as fresh_bytes holds (at
    least 2, all when they fit, else a subset drawn from the secret seed that the solution cannot
    tell apart) are judged on the host. Seeds derive from the launch's secret seed and the launch's
    label, so no two launches share them. (None, []) when the configuration asks for none."""
    from harness import timing
    from harness.context import derive_seed

    fresh_cap = int(tcfg.get("fresh_max", 0))
    if not fresh_cap:
        return None, []
    out_bytes = float(sum(t.numel() * t.element_size() for t in outputs))
    out_bytes = timing.max_over_ranks([out_bytes], calls.device)[0]
    by_bytes = int(float(tcfg.get("fresh_bytes", 0)) // max(out_bytes, 1.0))
    label = str(tcfg.get("fresh_label", ""))
    n_fresh = min(fresh_cap, max(int(tcfg.get("fresh_min", 2)), by_bytes, 2))
    pick = random.Random(derive_seed(base, "fresh judged", label))
    # the launch always times this many (harness.timing: the budget waits for them)
    sure = max(int(tcfg.get("fresh_min", 2)), 2)
    judged = judged_fresh_calls(n_fresh, sure, max(2, by_bytes), pick)
    return fresh_calls(calls, label, base, n_fresh, set(judged)), judged


def _timed(
    calls: Calls, sets: list[tuple], judged: list[list], shapes: list, fresh: Any
) -> tuple[TimingRecord, list[int]]:
    """The timed calls: (their record, which set's data each buffer holds as they end). A timed
    output must have the judged output's structure (its non-tensor parts equal) and tensors."""
    from harness import timing

    rotate = input_rotation(sets)
    holds = list(range(len(sets)))
    working: dict[int, tuple] = {}
    timed_set = [0]

    def rotate_sets() -> list[int]:
        assert rotate is not None
        holds[:] = rotate()
        return list(holds)

    def prepare(i: int) -> None:
        # in-place workloads are timed on fresh copies, made outside the timed region
        working[i] = snapshot(sets[i]) if calls.mutates else sets[i]

    def call_on_set(i: int) -> Any:
        timed_set[0] = i
        return calls.solution(*working[i])

    def normalize(out: Any) -> list | None:
        # compared with the judged outputs of the set just called: its in-place results too
        shape, outs = normalize_output(out)
        returned = len(outs)
        outs = calls.in_place(outs, working[timed_set[0]])
        shape, outs = calls.judged_form(shape, outs, returned, working[timed_set[0]])
        return outs if shape == shapes[holds[timed_set[0]]] else None

    record = timing.run_timing(
        prepare,
        call_on_set,
        normalize,
        judged,
        calls.device,
        calls.timing,
        calls.cfg["tolerance"],
        rotate=rotate_sets if rotate is not None else None,
        after_call=lambda: calls.check("while being timed"),
        fresh=fresh,
    )
    return record, holds
