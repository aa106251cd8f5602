"""Measure this node's ceilings for the roofline (torch + stdlib; our code, not a candidate's).

    python -m harness.calibrate --world-size N --out FILE [--device cuda|cpu]

Measures, each as the median of timed repetitions after a warm-up:
  peer copy, one direction, between GPU 0 and every other GPU (copy engine, 256 MiB);
  HBM: a device-to-device copy of 1 GiB on GPU 0 (bytes read + written per second);
  dense matmul rate in bf16 and in float32 (TF32 off), 8192-cubed and 4096-cubed;
  NCCL bus bandwidth of all_reduce, all_gather, reduce_scatter and all_to_all at 1 GiB across N
  ranks (one process per GPU), and the latency of an 8-byte all_reduce.
`--device cpu` is a dry run of the same code paths with gloo and tiny sizes (for tests): its
figures mean nothing. Writes JSON: the roofline's ceilings plus every measurement under "details".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from typing import Any

BUS_FACTOR = {
    "all_reduce": lambda w: 2 * (w - 1) / w,
    "all_gather": lambda w: (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w,
    "all_to_all": lambda w: (w - 1) / w,
}


def _timer(device: str):
    import torch

    def run(fn, reps: int) -> float:
        """Median seconds of one call of fn."""
        for _ in range(3):
            fn()
        samples = []
        for _ in range(reps):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    return run


def single_device(device: str, world_size: int) -> dict[str, Any]:
    import torch

    run = _timer(device)
    dev0 = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    big = 1 << 30 if device == "cuda" else 1 << 22
    out: dict[str, Any] = {}

    a = torch.empty(big, dtype=torch.uint8, device=dev0)
    b = torch.empty_like(a)
    t = run(lambda a=a, b=b: b.copy_(a), 20)
    out["hbm_copy_gbps"] = 2 * big / t / 1e9
    del a, b

    peers = []
    if device == "cuda":
        n = 256 << 20
        for j in range(1, min(world_size, torch.cuda.device_count())):
            for src, dst in ((0, j), (j, 0)):
                x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{src}")
                y = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dst}")
                with torch.cuda.device(src):
                    t = run(lambda x=x, y=y: y.copy_(x, non_blocking=True), 20)
                peers.append({"src": src, "dst": dst, "gbps": n / t / 1e9})
                del x, y
    out["peer_copy"] = peers

    torch.backends.cuda.matmul.allow_tf32 = False
    rates = {}
    for dtype, n in (
        ("bfloat16", 8192 if device == "cuda" else 256),
        ("float32", 4096 if device == "cuda" else 256),
    ):
        dt = getattr(torch, dtype)
        x = torch.randn(n, n, device=dev0).to(dt)
        y = torch.randn(n, n, device=dev0).to(dt)
        t = run(lambda x=x, y=y: torch.mm(x, y), 10)
        rates[dtype] = 2 * n**3 / t / 1e12
    out["matmul_tflops"] = rates
    return out


def _rank(rank: int, world_size: int, device: str, port: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", store=store, rank=rank, world_size=world_size
    )
    run = _timer(device)
    nbytes = 1 << 30 if device == "cuda" else 1 << 20
    n = nbytes // 2 // world_size * world_size
    x = torch.randn(n, device=dev).to(torch.bfloat16)
    shard = torch.empty(n // world_size, dtype=torch.bfloat16, device=dev)
    full = torch.empty_like(x)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x),
        "all_to_all": lambda: dist.all_to_all_single(full, x),
    }
    out = {}
    for name, fn in calls.items():
        dist.barrier()
        t = run(fn, 10)
        size = n * 2
        out[name] = {
            "bytes": size,
            "ms": t * 1e3,
            "busbw_gbps": size / t / 1e9 * BUS_FACTOR[name](world_size),
        }
    tiny = torch.ones(2, dtype=torch.float32, device=dev)
    dist.barrier()
    out["small_all_reduce_us"] = run(lambda: dist.all_reduce(tiny), 50) * 1e6
    if rank == 0:
        results.put(out)
    dist.barrier()
    dist.destroy_process_group()


def collectives(device: str, world_size: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, world_size, device, port, results)) for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out = results.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return out


def calibrate(device: str, world_size: int) -> dict[str, Any]:
    import torch

    t0 = time.monotonic()
    details: dict[str, Any] = {"device": device, "world_size": world_size, "host": socket.gethostname()}
    if device == "cuda":
        details["gpu"] = torch.cuda.get_device_name(0)
    details.update(single_device(device, world_size))
    details["collectives"] = collectives(device, world_size)
    details["seconds"] = round(time.monotonic() - t0, 1)
    peer = [p["gbps"] for p in details["peer_copy"]]
    return {
        "nvlink_gbps": statistics.median(peer) if peer else 0.0,
        "hbm_gbps": details["hbm_copy_gbps"],
        "matmul_tflops": details["matmul_tflops"],
        "details": details,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = calibrate(args.device, args.world_size)
    tmp = args.out + ".part"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
