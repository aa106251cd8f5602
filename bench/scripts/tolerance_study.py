"""How far correct solutions are from each problem's reference, output by output, against its bounds.

Run on CPU from the repository root, e.g.
    python3 bench/scripts/tolerance_study.py --problems 19,21,22 --world-sizes 2 4 --seeds 3
    python3 bench/scripts/tolerance_study.py --problems 21 --variant tests/adversarial/clip_coefficient_off.py

For each problem, world size and seed, every rank (gloo, one process each) builds its inputs, runs the
reference and each variant on them, and compares each output with the reference's the way
pkb_mcp.runs.judge does: per output, the worst element's |out - ref| / (atol + rtol |ref|) ("elem", fails
above 1) and ‖out - ref‖ / ‖ref‖ against its rel_norm bound ("norm x bound", fails above 1). The
variants: `wider` (the reference itself on its floating inputs upcast, bf16 to float32 and float32
to float64, outputs rounded back to the reference's dtypes: a more precise correct solution) and
any candidate files given with `--variant`. One line per (problem, world size, variant, output),
the worst over ranks and seeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.context import DTYPES, ProblemContext, derive_seed  # noqa: E402
from harness.timing import output_bounds  # noqa: E402
from pkb_mcp import problems  # noqa: E402


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tensors(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def wider_twin(solution):
    """The solution on wider copies of its floating inputs (bf16 -> float32, float32 -> float64),
    outputs rounded to the reference's dtypes: a more precise correct solution."""

    def run(inputs: tuple, like: list[torch.Tensor]) -> list[torch.Tensor]:
        wide = tuple(
            a.to(WIDER[a.dtype]) if isinstance(a, torch.Tensor) and a.dtype in WIDER else a for a in inputs
        )
        return [o.to(r.dtype) for o, r in zip(_tensors(solution(*wide)), like, strict=True)]

    return run


def _measure(got: list[torch.Tensor], want: list[torch.Tensor], tol: dict) -> list[tuple[float, float]]:
    """Per output: (worst elementwise ratio to atol + rtol|ref|, relative norm / rel_norm bound)."""
    rows = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        b = output_bounds(tol, i)
        if not (w.dtype.is_floating_point or w.dtype.is_complex):
            same = torch.equal(g, w)
            rows.append((0.0 if same else math.inf, 0.0 if same else math.inf))
            continue
        kind = torch.complex128 if w.dtype.is_complex else torch.float64
        g64, w64 = g.to(kind), w.to(kind)
        diff = (g64 - w64).abs()
        allowed = b["atol"] + b["rtol"] * w64.abs()
        elem = float((diff / allowed.clamp_min(1e-300)).max()) if diff.numel() else 0.0
        ref = float(w64.abs().norm())
        norm = float(diff.norm()) / ref if ref > 0 else 0.0
        rows.append((elem, norm / b["rel_norm"] if b["rel_norm"] > 0 else (0.0 if norm == 0 else math.inf)))
    return rows


def _rank(rank: int, world_size: int, store_path: str, jobs: list, queue) -> None:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    results = []
    for pid, variant_paths, seeds in jobs:
        p = problems.suite()[pid]
        ref = p.module.solution
        variants = {"wider": wider_twin(ref)}
        for v in variant_paths:
            module = _load(Path(v), f"variant_{Path(v).stem}")
            variants[Path(v).stem] = lambda inputs, like, s=module.solution: _tensors(s(*inputs))
        for seed in seeds:
            ctx = ProblemContext(rank, world_size, p.size("pkb"), DTYPES[p.dtype], torch.device("cpu"), seed)
            inputs = p.module.make_inputs(ctx)
            inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            want = [t.clone() for t in _tensors(ref(*inputs))]
            for name, run in variants.items():
                try:
                    got = run(inputs, want)
                except Exception as exc:  # a variant that does not apply here: said so, not measured
                    results.append(
                        (pid, world_size, name, -1, math.nan, f"{type(exc).__name__}: {exc}"[:120])
                    )
                    continue
                for i, (elem, norm) in enumerate(_measure(got, want, p.bounds)):
                    results.append((pid, world_size, name, i, elem, norm))
    gathered = [None] * world_size
    dist.all_gather_object(gathered, results)
    if rank == 0:
        queue.put([r for part in gathered for r in part])
    dist.destroy_process_group()


def study(pids: list[int], world_size: int, variants: list[str], n_seeds: int) -> list[tuple]:
    suite = problems.suite()
    jobs = []
    for pid in pids:
        if suite[pid].world_size_error(world_size, "pkb"):
            continue
        jobs.append((pid, variants, [derive_seed(12345, pid, world_size, s) for s in range(n_seeds)]))
    if not jobs:
        return []
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_rank, args=(r, world_size, store, jobs, queue)) for r in range(world_size)
        ]
        for proc in procs:
            proc.start()
        rows = queue.get(timeout=1800)  # raises queue.Empty if the ranks died
        for proc in procs:
            proc.join()
    worst: dict[tuple, tuple] = {}
    for pid, ws, name, i, elem, norm in rows:
        key = (pid, ws, name, i)
        if i < 0:
            worst[key] = (elem, norm)
            continue
        old = worst.get(key, (0.0, 0.0))
        worst[key] = (max(old[0], elem), max(old[1], norm))
    return [(*k, *v) for k, v in sorted(worst.items())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="", help="comma-separated ids (default: every problem)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], help="a candidate file to measure as well")
    args = ap.parse_args()
    pids = [int(x) for x in args.problems.split(",") if x] or sorted(problems.suite())
    print("| problem | W | variant | output | elem (fails > 1) | norm x bound (fails > 1) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ws in args.world_sizes:
        for pid, w, name, i, elem, norm in study(pids, ws, args.variant, args.seeds):
            if i < 0:
                print(f"| {pid} | {w} | {name} | - | not run: {norm} | |", flush=True)
            else:
                print(f"| {pid} | {w} | {name} | {i} | {elem:.3g} | {norm:.3g} |", flush=True)


if __name__ == "__main__":
    main()
