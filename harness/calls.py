"""One call of a solution on this rank, and what the harness learns of it: its outputs as they were
at return, which of them alias an input, which inputs it changed, module arguments' parameters and
buffers included (torch + stdlib only)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import structure
from harness.contracts import RankConfig, TimingConfig


class SolutionError(Exception):
    """The solution returned something outside the contract."""


def normalize_output(out: Any) -> tuple[structure.Structure, list]:
    """A solution's return -> (structure, tensors) (harness/structure.py); what cannot be judged
    breaks the contract."""
    try:
        return structure.encode(out)
    except ValueError as exc:
        raise SolutionError(f"solution returned something the harness cannot judge: {exc}") from exc


# the interpreter's trace and profile hooks as the harness found them, before any solution was imported
_HOOKS = (sys.gettrace(), sys.getprofile())


def returning_plain(solution: Callable[..., Any]) -> Callable[..., Any]:
    """The solution, its return checked and rebuilt as plain values (harness/structure.py `plain`)
    before the call returns: inside the call, and so inside the timed region, so that nothing of the
    candidate's (a tensor subclass's __torch_function__, a container's __iter__, a torch mode or an
    interpreter hook it left active) can run deferred work once the clock has stopped."""

    def call(*args: Any) -> Any:
        out = solution(*args)
        try:
            kept = structure.plain(out)
        except ValueError as exc:
            raise SolutionError(f"solution returned something the harness cannot judge: {exc}") from None
        del out  # what the candidate's own objects do as they go, they do here, on the clock
        left = left_active()
        if left:
            raise SolutionError(f"the solution left {left} active at return: {ACTIVE_AFTER}")
        return kept

    return call


ACTIVE_AFTER = "it would run the harness's own work after the clock stops; leave nothing active"


def left_active() -> str | None:
    """What a solution left active that would run its code inside the harness's own calls: a torch
    function or dispatch mode (torch's own default-device mode aside) or a trace or profile hook
    the harness did not have; None when nothing."""
    import torch
    from torch.utils._device import DeviceContext

    modes = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    foreign = [m for m in modes if type(m) is not DeviceContext]
    if foreign:
        return f"a torch function mode ({structure.type_name(type(foreign[0]))})"
    if torch._C._len_torch_dispatch_stack():
        return "a torch dispatch mode"
    if (sys.gettrace(), sys.getprofile()) != _HOOKS:
        return "a trace or profile hook (sys.settrace, sys.setprofile)"
    return None


MAX_INPUT_DEPTH = 4  # nesting of tuples, lists and dicts searched for tensors among the inputs


def input_tensors(inputs: tuple | list) -> list[tuple[str, Any]]:
    """Every tensor the inputs hold, named as a message names it: tensor arguments ("input 2"),
    tensors inside tuples, lists and dicts ("input 1[0]"), the parameters and buffers of module
    arguments ("input 3 (Linear) parameter weight"), and the indices and values of sparse COO
    tensors ("input 0 (sparse values)")."""
    import torch

    found: list[tuple[str, Any]] = []

    def walk(value: Any, name: str, depth: int) -> None:
        if isinstance(value, torch.Tensor) and value.layout == torch.sparse_coo:
            # its indices and values, as they lie (views of the sparse tensor's own memory)
            found.append((f"{name} (sparse indices)", value._indices()))
            found.append((f"{name} (sparse values)", value._values()))
        elif isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, torch.nn.Module):
            kind = type(value).__name__
            found.extend((f"{name} ({kind}) parameter {n}", p) for n, p in value.named_parameters())
            found.extend((f"{name} ({kind}) buffer {n}", b) for n, b in value.named_buffers())
        elif depth < MAX_INPUT_DEPTH and isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]", depth + 1)
        elif depth < MAX_INPUT_DEPTH and isinstance(value, dict):
            for k, item in value.items():
                walk(item, f"{name}[{k!r}]", depth + 1)

    for i, value in enumerate(inputs):
        walk(value, f"input {i}", 0)
    return found


def _storage_span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def aliased_inputs(outputs: list, inputs: list) -> list[int]:
    """Indices of outputs whose memory overlaps the memory of any tensor the inputs hold."""
    spans = [_storage_span(t) for _, t in input_tensors(inputs) if t.numel()]
    hits = []
    for i, o in enumerate(outputs):
        if not o.numel():
            continue
        lo, hi = _storage_span(o)
        if any(lo < b and a < hi for a, b in spans):
            hits.append(i)
    return hits


FINGERPRINT_CHUNK = 1 << 22  # bytes of an input read at a time: the fingerprint's only extra memory


def fingerprint(t: Any, key: int) -> tuple:
    """A keyed digest of a tensor's bytes, computed where it lies, a chunk at a time: each byte
    weighted by a secret random word (wrapping int64 sums), each chunk by a secret odd factor. A
    change that keeps it needs the key (the launch's secret seed)."""
    import random

    import torch

    head = (tuple(t.shape), t.stride(), t.dtype)
    if not t.numel():
        return head
    raw = t.detach().reshape(-1).view(torch.uint8)
    n = min(raw.numel(), FINGERPRINT_CHUNK)
    gen = torch.Generator(device=raw.device)
    gen.manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)
    weights = torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen, device=raw.device, dtype=torch.int64)
    factors = random.Random(key)
    total = torch.zeros((), dtype=torch.int64, device=raw.device)
    for start in range(0, raw.numel(), n):
        chunk = raw[start : start + n].to(torch.int64)
        part = (chunk * weights[: chunk.numel()]).sum()
        total += part * (factors.getrandbits(62) | 1)
    return (*head, int(total))


class Pristine:
    """The inputs as they were before a call, for the mutation check after it: a copy of every
    tensor they hold, or, for a problem with LEAN_INPUTS, a keyed fingerprint of each (no copy:
    such inputs fill most of a GPU)."""

    def __init__(self, inputs: tuple | list, lean_key: int | None = None, private: bool = False) -> None:
        """`private`: `inputs` is already a private copy of the set checked (kept, not copied)."""
        self.key = lean_key
        tensors = input_tensors(inputs)
        if lean_key is None:
            self.kept = [(name, t if private else t.clone()) for name, t in tensors]
        else:
            self.kept = [(name, fingerprint(t, lean_key)) for name, t in tensors]

    def changed(self, inputs: tuple | list) -> list[str]:
        """The names of the tensors the inputs hold that differ from what they held (all of them,
        should the inputs no longer hold the same tensors)."""
        import torch

        now = input_tensors(inputs)
        if [n for n, _ in now] != [n for n, _ in self.kept]:
            return [n for n, _ in self.kept] or ["the inputs"]
        if self.key is not None:
            key = self.key
            return [n for (n, t), (_, f) in zip(now, self.kept, strict=True) if fingerprint(t, key) != f]
        return [
            n
            for (n, t), (_, s) in zip(now, self.kept, strict=True)
            if t.shape != s.shape or not torch.equal(t, s)
        ]


def snapshot(inputs: tuple) -> tuple:
    """A working copy of an input set: every tensor it holds cloned (inside tuples, lists and dicts
    too, to the depth `input_tensors` searches; sparse ones with their indices), module arguments
    deep-copied, the containers rebuilt: what a workload that updates its inputs is called with, so
    that the set itself stays as it was."""
    import copy

    import torch

    def copied(value: Any, depth: int) -> Any:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, torch.nn.Module):
            return copy.deepcopy(value)
        if depth < MAX_INPUT_DEPTH and isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
            items = [copied(v, depth + 1) for v in value]
            return items if isinstance(value, list) else tuple(items)
        if depth < MAX_INPUT_DEPTH and isinstance(value, dict):
            return {k: copied(v, depth + 1) for k, v in value.items()}
        return value

    return tuple(copied(v, 0) for v in inputs)


def copy_at_return(outs: list, caller: Any) -> list:
    """The outputs as they are when solution() returns. On a GPU the copy is queued on the stream
    that was current at the call (the caller's), so work left running on a side stream, queued
    later by a thread, or remote writes that had not landed when the solution returned, are not in
    it: the contract is an output that is complete on the caller's stream at return."""
    import torch

    if caller is None:
        return [o.detach().clone() for o in outs]
    with torch.cuda.stream(caller):
        return [o.detach().clone() for o in outs]


class Calls:
    """What every mode of a launch shares on this rank: the problem's inputs for a seed, one judged
    call of the solution, and its outputs saved for the host with the launch's keyed digest."""

    def __init__(
        self,
        problem: ModuleType,
        solution: Callable[..., Any],
        cfg: RankConfig,
        device: Any,
        out_dir: Path,
        check: Callable[[str], None],
    ) -> None:
        from harness import tensorfile
        from harness.context import DTYPES

        self.problem = problem
        self.solution = returning_plain(solution)  # every judged and timed call goes through it
        self.cfg = cfg
        self.rank = int(cfg["rank"])
        self.world_size = int(cfg["world_size"])
        self.device = device
        self.dtype = DTYPES[cfg["dtype"]]
        self.mutates = bool(getattr(problem, "MUTATES_INPUTS", False))
        self.lean = bool(getattr(problem, "LEAN_INPUTS", False))
        self.out_dir = out_dir
        self.mac_key = tensorfile.result_key(cfg["seeds"])  # the host checks every result file with it
        self.check = check  # fails the rank if the solution replaced what the harness relies on
        # the problem's canonical order of its outputs (docs/problem-format.md), taken before the
        # solution was imported: a solution that replaces it afterwards fails the Watch's check
        self.canonical: Callable[[Any, tuple], Any] | None = getattr(problem, "canonical", None)
        # lean inputs are fingerprinted, not copied, under a key the solution is never given
        self.lean_key = int.from_bytes(self.mac_key[8:16], "little") if self.lean else None

    @property
    def timing(self) -> TimingConfig:
        """The launch's timing configuration (benchmark and profile launches carry one)."""
        timing = self.cfg["timing"]
        if timing is None:
            raise ValueError(f"a {self.cfg['mode']} launch needs a timing configuration")
        return timing

    def make(self, seed: Any) -> tuple:
        """The problem's inputs on this rank for a seed."""
        from harness.context import ProblemContext

        ctx = ProblemContext(
            rank=self.rank,
            world_size=self.world_size,
            size=self.cfg["size"],
            dtype=self.dtype,
            device=self.device,
            seed=seed,
        )
        inputs = self.problem.make_inputs(ctx)
        return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)

    def pristine(self, inputs: tuple | list) -> Pristine | None:
        """What the mutation check compares `inputs` with after a call; None where the workload
        updates its inputs (then they are judged as outputs instead)."""
        return None if self.mutates else Pristine(inputs, self.lean_key)

    def aliasing(self, outs: list, inputs: list, returned: int) -> list[int]:
        """The returned outputs whose memory overlaps an input's, less those the contract allows."""
        from harness import convention

        aliased = aliased_inputs(outs[:returned], inputs)
        held = [t for _, t in input_tensors(inputs)]  # inside lists too: returned after an update in place
        return convention.aliasing_faults(self.problem, self.rank, self.world_size, outs, held, aliased)

    def in_place(self, outs: list, inputs: tuple | list) -> list:
        """The outputs judged: the returned ones, then, where the workload updates its inputs, every
        tensor the inputs hold after the call (`input_tensors`' order: inside tuples, lists and
        dicts, module parameters and buffers, sparse indices and values)."""
        return outs + [t for _, t in input_tensors(inputs)] if self.mutates else outs

    def judged_form(
        self, shape: structure.Structure, outs: list, returned: int, inputs: tuple | list
    ) -> tuple[structure.Structure, list]:
        """The outputs as they are judged: the returned ones (the first `returned` of `outs`) in the
        problem's canonical order where it has one, then the in-place outputs, unchanged, as more
        items of the outermost tuple. Applied to the reference's and the candidate's outputs alike,
        where they are judged (never inside a timed call)."""
        if self.canonical is not None:
            value = structure.decode(shape, outs[:returned])
            try:
                ordered = self.canonical(value, tuple(inputs))
            except Exception as exc:
                raise SolutionError(
                    f"the problem's canonical order could not be applied to the outputs "
                    f"({type(exc).__name__}: {exc}); return the reference's structure"
                ) from exc
            shape, tensors = normalize_output(ordered)
            outs = tensors + outs[returned:]
            returned = len(tensors)
        return structure.extended(shape, returned, len(outs) - returned), outs

    def judge_call(self, inputs: tuple) -> tuple[structure.Structure, list, dict[str, Any]]:
        """One checked call: the outputs as they were at return (private copies), plus what the
        host must know (aliasing, mutation)."""
        import torch
        import torch.distributed as dist

        pristine = self.pristine(inputs)
        caller = torch.cuda.current_stream() if self.device.type == "cuda" else None
        result = self.solution(*inputs)
        self.check("during a call")
        shape, outs = normalize_output(result)
        returned = len(outs)
        outs = self.in_place(outs, inputs)
        at_return = copy_at_return(outs, caller)
        if caller is not None:
            torch.cuda.set_stream(caller)  # whatever stream the solution left current
            torch.cuda.synchronize()
        dist.barrier()  # every rank's work has ended before inputs are compared
        meta: dict[str, Any] = {"aliased_outputs": self.aliasing(outs, list(inputs), returned)}
        meta["mutated_inputs"] = [] if pristine is None else pristine.changed(inputs)
        shape, at_return = self.judged_form(shape, at_return, returned, inputs)
        return shape, at_return, meta

    def save(self, name: str, outs: list, shape: structure.Structure, meta: dict[str, Any]) -> None:
        """Outputs for the host: out/{name}_r{rank}.pkbt, with the launch's keyed digest."""
        from harness import tensorfile

        path = self.out_dir / f"{name}_r{self.rank}.pkbt"
        tensorfile.save(path, outs, shape, meta, key=self.mac_key)
