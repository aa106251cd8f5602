"""One call of a solution on this rank, and what the harness learns of it: its outputs as they were
at return, which of them alias an input, which inputs it changed (torch + stdlib only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.contracts import RankConfig, TimingConfig


class SolutionError(Exception):
    """The solution returned something outside the contract."""


def normalize_output(out: Any) -> tuple[str, list]:
    """A tensor or a tuple/list of tensors -> (structure, tensors); anything else breaks the contract."""
    import torch

    if isinstance(out, torch.Tensor):
        return "tensor", [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return "tuple", list(out)
    kind = type(out).__name__
    raise SolutionError(f"solution must return a tensor or a tuple of tensors, not {kind}")


def _storage_span(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def aliased_inputs(outputs: list, inputs: list) -> list[int]:
    """Indices of outputs whose memory overlaps any input's memory."""
    import torch

    spans = [_storage_span(t) for t in inputs if isinstance(t, torch.Tensor) and t.numel()]
    hits = []
    for i, o in enumerate(outputs):
        if not o.numel():
            continue
        lo, hi = _storage_span(o)
        if any(lo < b and a < hi for a, b in spans):
            hits.append(i)
    return hits


def mutated_inputs(inputs: list, snapshots: list) -> list[int]:
    import torch

    return [
        i
        for i, (t, s) in enumerate(zip(inputs, snapshots, strict=True))
        if isinstance(t, torch.Tensor) and not torch.equal(t, s)
    ]


def snapshot(inputs: tuple) -> tuple:
    import torch

    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)


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
        self.solution = solution
        self.cfg = cfg
        self.rank = int(cfg["rank"])
        self.world_size = int(cfg["world_size"])
        self.device = device
        self.dtype = DTYPES[cfg["dtype"]]
        self.mutates = bool(getattr(problem, "MUTATES_INPUTS", False))
        self.out_dir = out_dir
        self.mac_key = tensorfile.result_key(cfg["seeds"])  # the host checks every result file with it
        self.check = check  # fails the rank if the solution replaced what the harness relies on

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

    def aliasing(self, outs: list, inputs: list, returned: int) -> list[int]:
        """The returned outputs whose memory overlaps an input's, less those the contract allows."""
        from harness import convention

        aliased = aliased_inputs(outs[:returned], inputs)
        return convention.aliasing_faults(self.problem, self.rank, self.world_size, outs, inputs, aliased)

    def in_place(self, outs: list, inputs: tuple) -> list:
        """The outputs judged: the returned ones, then the inputs a mutating workload updated."""
        import torch

        return outs + [t for t in inputs if isinstance(t, torch.Tensor)] if self.mutates else outs

    def judge_call(self, inputs: tuple) -> tuple[str, list, dict[str, Any]]:
        """One checked call: the outputs as they were at return (private copies), plus what the
        host must know (aliasing, mutation)."""
        import torch
        import torch.distributed as dist

        snaps = None if self.mutates else snapshot(inputs)
        caller = torch.cuda.current_stream() if self.device.type == "cuda" else None
        result = self.solution(*inputs)
        self.check("during a call")
        structure, outs = normalize_output(result)
        returned = len(outs)
        outs = self.in_place(outs, inputs)
        at_return = copy_at_return(outs, caller)
        if caller is not None:
            torch.cuda.set_stream(caller)  # whatever stream the solution left current
            torch.cuda.synchronize()
        dist.barrier()  # every rank's work has ended before inputs are compared
        meta: dict[str, Any] = {"aliased_outputs": self.aliasing(outs, list(inputs), returned)}
        meta["mutated_inputs"] = [] if snaps is None else mutated_inputs(list(inputs), list(snaps))
        return structure, at_return, meta

    def save(self, name: str, outs: list, structure: str, meta: dict[str, Any]) -> None:
        """Outputs for the host: out/{name}_r{rank}.pkbt, with the launch's keyed digest."""
        from harness import tensorfile

        path = self.out_dir / f"{name}_r{self.rank}.pkbt"
        tensorfile.save(path, outs, structure, meta, key=self.mac_key)
