"""Hardware counters of NVLink traffic inside the sandbox (standard library and ctypes only).

docs/nvlink-counters.md is the design. This module holds:
- where Nsight Compute (`ncu`) is and why it cannot run here (the host asks the same before it plans a
  counter launch: its process sandbox sees the same machine);
- the command a rank's worker starts under in a counter launch (harness/launch.py), one `ncu` per
  rank with a lock file of its own;
- NVML's NVLink byte counters of one GPU, read through ctypes from the driver's libnvidia-ml
  (harness/profile.py): no Python binding is installed on the GPU hosts.

Names taken from NVIDIA's documentation and headers and not yet seen on our machines: the NVML field
ids 138/139 (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, cumulative KiB, scope UINT_MAX = all links),
the layout of nvmlFieldValue_t, and every `ncu` option below (Nsight Compute 2025.3 CLI).
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from harness.contracts import CounterPlan

NCU_PLACES = (
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda/nsight-compute-*/ncu",
)
NVIDIA_PARAMS = Path("/proc/driver/nvidia/params")
WORKER_TMPDIR = "PKB_WORKER_TMPDIR"  # under ncu: the TMPDIR the worker takes back from its ncu's


def find_ncu(env: Mapping[str, str] | None = None) -> str | None:
    """The ncu executable: $PKB_NCU, else on PATH, else in NVIDIA's install folders (the newest)."""
    env = os.environ if env is None else env
    configured = env.get("PKB_NCU")
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    on_path = shutil.which("ncu", path=env.get("PATH"))
    if on_path:
        return on_path
    for pattern in NCU_PLACES:
        for found in sorted(glob.glob(pattern), reverse=True):
            if os.access(found, os.X_OK):
                return found
    return None


def _effective_capabilities() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def ncu_unavailable(device_type: str, ncu: str | None) -> str | None:
    """Why Nsight Compute cannot count this launch's kernels here; None when it may."""
    if device_type != "cuda":
        return "the launch ran on CPU"
    if ncu is None:
        return "Nsight Compute (ncu) was not found ($PKB_NCU, PATH, /opt/nvidia/nsight-compute)"
    try:
        admin_only = "RmProfilingAdminOnly: 1" in NVIDIA_PARAMS.read_text()
    except OSError:
        admin_only = True  # unknown: assume the driver's default
    if admin_only and _effective_capabilities() in (0, None):
        return (
            "the driver restricts performance counters to administrators (RmProfilingAdminOnly) and "
            "this process has no capabilities"
        )
    return None


def ncu_wrapper(plan: CounterPlan, rank: int, launch_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command line a rank's worker runs under, and the variables it adds: the rank's own TMPDIR,
    so that its `ncu` takes a lock file of its own (one shared lock serialises every profiled process
    on the machine, and a kernel waiting for a peer's kernel would wait forever), and the launch's
    TMPDIR for the worker to take back (WORKER_TMPDIR): the ranks' symmetric memory finds a peer's
    socket at `$TMPDIR/symm_mem-PID`, so they must share one."""
    shared = Path(os.environ.get("TMPDIR") or launch_dir / "tmp")  # the sandbox's: short
    tmp = shared / f"ncu-r{rank}"
    tmp.mkdir(parents=True, exist_ok=True)
    out = launch_dir / "profile"
    out.mkdir(exist_ok=True)
    argv = [
        plan["ncu"],
        "--profile-from-start", "off",  # only between cudaProfilerStart and Stop (harness/profile.py)
        "--clock-control", "none",  # the GPU hosts refuse locked clocks
        "--cache-control", "none",
        "--replay-mode", "kernel",
        "--target-processes", "application-only",
        "--launch-count", str(max(1, plan["max_kernels"])),
        "--metrics", ",".join(plan["metrics"]),
        "--csv", "--page", "raw", "--print-units", "base",
        "--log-file", str(out / f"r{rank}.ncu.csv"),
    ]  # fmt: skip
    return argv, {"TMPDIR": str(tmp), WORKER_TMPDIR: str(shared)}


# ---------------------------------------------------------------- NVML

NVML_LIB = "libnvidia-ml.so.1"
FI_NVLINK_DATA_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: payload sent, KiB, cumulative
FI_NVLINK_DATA_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
SCOPE_ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: the sum over the GPU's links
# nvmlValueType_t values holding integers: unsigned int, unsigned long, unsigned long long, signed long long
INTEGER_TYPES = {1: 0xFFFFFFFF, 2: (1 << 64) - 1, 3: (1 << 64) - 1, 4: (1 << 63) - 1}


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t (nvml.h); its value is a union of 8 bytes, read here as one integer."""

    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_ulonglong),
    ]


class NvmlError(RuntimeError):
    """NVML cannot give this GPU's NVLink counters; the message says why."""


def field_bytes(value: FieldValue) -> int:
    """The bytes an NVLink throughput field holds (it counts KiB), or NvmlError."""
    if value.nvmlReturn != 0:
        raise NvmlError(f"NVML refused field {value.fieldId} (nvmlReturn {value.nvmlReturn})")
    mask = INTEGER_TYPES.get(value.valueType)
    if mask is None:
        raise NvmlError(f"NVML gave field {value.fieldId} as value type {value.valueType}, not an integer")
    return (value.value & mask) * 1024


def pci_bus_id(domain: int, bus: int, device: int) -> str:
    """The PCI address NVML looks a GPU up by (it ignores CUDA_VISIBLE_DEVICES, torch's index does not)."""
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


class NvlinkCounters:
    """The NVLink payload counters of one GPU: `read()` gives (bytes sent, bytes received) so far."""

    def __init__(self, bus_id: str, library: str = NVML_LIB) -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise NvmlError(f"NVML could not be loaded ({library}: {exc})") from exc
        self._call("nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByPciBusId_v2", bus_id.encode(), ctypes.byref(self._handle))
        self.read()  # a GPU or driver without the fields fails here, once

    def _call(self, name: str, *args: object) -> None:
        try:
            code = getattr(self._lib, name)(*args)
        except AttributeError as exc:
            raise NvmlError(f"this NVML has no {name}") from exc
        if code != 0:
            raise NvmlError(f"{name} failed: {self._error(code)}")

    def _error(self, code: int) -> str:
        try:
            describe = self._lib.nvmlErrorString
            describe.restype = ctypes.c_char_p
            text = describe(code)
        except (AttributeError, OSError):
            text = None
        return f"{text.decode(errors='replace')} ({code})" if isinstance(text, bytes) else f"error {code}"

    def read(self) -> tuple[int, int]:
        values = (FieldValue * 2)()
        for value, field in zip(values, (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX), strict=True):
            value.fieldId, value.scopeId = field, SCOPE_ALL_LINKS
        self._call("nvmlDeviceGetFieldValues", self._handle, 2, values)
        return field_bytes(values[0]), field_bytes(values[1])
