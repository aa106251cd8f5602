"""pkb's stand-in for the original benchmark's `scripts/worker.py`, which its published copy lacks.

bench/scripts/side_by_side.py places this file at `scripts/worker.py` in a temporary copy of the
original benchmark, so that the original's own launcher (`run_local.py`) runs unchanged. One process
per rank under `torchrun`, invoked as run_local.py invokes it:

    worker.py --backend B --problem_py FILE --logs_dir DIR --rows M --cols N --dtype D
              --problem_id ID --trial T

What a rank does, in the original's order: it points TORCH_EXTENSIONS_DIR at a folder of its own
(concurrent JIT builds would race on one) and sets TORCH_CUDA_ARCH_LIST to 9.0 unless set; imports
FILE (before the process group exists, so code at import runs without one); initialises the process
group through the original's own `utils/init_and_finalize_backends.py` for B; builds its inputs with
the original's `create_input_tensor(rank, W, ID, (M, N), D, trial=T)` (seeded per problem, rank and
trial there); calls `solution(*inputs)`; synchronises, then writes the output with the original's
`save_tensor` as DIR/rank_{rank}.pt, which run_local.py compares. Verdicts only: the timing and
profiling switches (--measure_perf, --profile) are refused.

PKB_ORIGINAL_DEVICE=cpu (not a switch of the original's; run_local.py passes the environment
through) runs the ranks on the CPU over gloo instead of CUDA over NCCL: the original's input builder
takes a device, but its backend initialisers are NCCL-only, so this mode initialises gloo itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

if "TORCH_CUDA_ARCH_LIST" not in os.environ:  # the original targets Hopper; set before torch loads
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent  # the original benchmark's copy
sys.path.insert(0, str(ROOT))

# the original worker's --backend choices; run_local.py passes the solution's backend name
BACKENDS = ("reference", "triton", "cuda", "parallelkittens")
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--problem_py", required=True)
    parser.add_argument("--logs_dir", required=True)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--problem_id", type=int, default=1)
    parser.add_argument("--trial", type=int, default=0)
    parser.add_argument("--measure_perf", action="store_true")
    parser.add_argument("--measure-warmup-iters", type=int, default=500)
    parser.add_argument("--measure-profiling-iters", type=int, default=100)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if args.measure_perf or args.profile:
        parser.error("pkb's stand-in worker gives verdicts only: --measure_perf and --profile are refused")
    return args


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("solution_mod", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "solution"):
        raise AttributeError(f"no solution() in {path}")
    return module


def start(backend: str, rank: int, world_size: int, on_cpu: bool) -> torch.device:
    """The process group, and the device this rank's inputs live on."""
    if on_cpu:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        return torch.device("cpu")
    from utils import init_and_finalize_backends as backends  # the original's, from the copy

    getattr(backends, f"init_{backend}")(rank, world_size)
    return torch.device("cuda", rank)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit("run under torchrun: RANK and WORLD_SIZE must be set")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    on_cpu = os.environ.get("PKB_ORIGINAL_DEVICE", "cuda") == "cpu"

    base = os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(base, f"pkb_rank_{rank}")
    os.makedirs(os.environ["TORCH_EXTENSIONS_DIR"], exist_ok=True)

    from utils.input_output_tensors import create_input_tensor, save_tensor

    started = False
    try:
        module = load(args.problem_py)
        device = start(args.backend, rank, world_size, on_cpu)
        started = True
        inputs: tuple[Any, ...] = create_input_tensor(
            rank,
            world_size,
            args.problem_id,
            (args.rows, args.cols),
            DTYPES[args.dtype],
            trial=args.trial,
            device=device,
        )
        output = module.solution(*inputs)
        if not on_cpu:
            torch.cuda.synchronize()
        dist.barrier()
        save_tensor(output, args.logs_dir, rank)
        dist.barrier()
    except Exception:
        print(f"[rank {rank}/{world_size}] {traceback.format_exc()}", file=sys.stderr, flush=True)
        raise
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
