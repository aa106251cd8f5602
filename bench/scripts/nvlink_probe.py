"""Issue 34: do NVML's NVLink counters count what harness/counters.py says they count? On a node with
two or more GPUs: for each size, one peer copy from GPU 1 to GPU 0 and one back (torch issues them to
the copy engine), with NVML's payload counters of both GPUs read before and after (right after the
copy, then again after a pause, to see whether the counters lag). Prints one JSON line per copy:
the bytes copied and each GPU's tx/rx deltas. Expect GPU 0's rx and GPU 1's tx near the bytes copied
on the first copy. With --local, one local kernel instead (for `ncu` to count: its NVLink bytes
should be near zero).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import counters  # noqa: E402 - the checkout's, not an installed copy


def reader(device: int) -> counters.NvlinkCounters:
    props = torch.cuda.get_device_properties(device)
    address = [getattr(props, n) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    return counters.NvlinkCounters(counters.pci_bus_id(*address))


def deltas(readers: list[counters.NvlinkCounters], before: list[tuple[int, int]]) -> list[dict[str, int]]:
    now = [r.read() for r in readers]
    return [{"tx": a[0] - b[0], "rx": a[1] - b[1]} for a, b in zip(now, before, strict=True)]


def copy(
    src_dev: int, dst_dev: int, nbytes: int, readers: list[counters.NvlinkCounters], pause_s: float
) -> dict:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=f"cuda:{src_dev}")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst_dev}")
    dst.copy_(src)  # once, so that peer access is set up before counting
    torch.cuda.synchronize(src_dev)
    torch.cuda.synchronize(dst_dev)
    before = [r.read() for r in readers]
    t0 = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize(src_dev)
    torch.cuda.synchronize(dst_dev)
    copy_ms = (time.perf_counter() - t0) * 1e3
    at_once = deltas(readers, before)
    time.sleep(pause_s)
    later = deltas(readers, before)
    return {
        "copy": f"cuda:{src_dev} -> cuda:{dst_dev}",
        "bytes": nbytes,
        "copy_ms": round(copy_ms, 3),
        "at_once": at_once,
        f"after_{pause_s:g}s": later,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--pause", type=float, default=1.0)
    parser.add_argument("--local", action="store_true", help="one local kernel, for ncu to count")
    args = parser.parse_args()
    if args.local:
        x = torch.ones(1 << 24, device="cuda")
        torch.cuda.synchronize()
        print(json.dumps({"local_sum": float((x * 2).sum().item())}))
        return
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    try:
        readers = [reader(0), reader(1)]
    except counters.NvmlError as exc:
        print(json.dumps({"nvml": f"unavailable: {exc}"}))
        return
    for mib in args.mib:
        for src, dst in ((1, 0), (0, 1)):
            print(json.dumps(copy(src, dst, mib << 20, readers, args.pause)), flush=True)


if __name__ == "__main__":
    main()
