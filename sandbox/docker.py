"""The Docker backend: one hardened container per launch, holding all of its ranks.

The container has no network, a read-only root, an exec-capable tmpfs at /tmp (JIT builds load .so
files from it), a non-root user, no capabilities, no-new-privileges, pid and memory limits, an init,
and our label. It sees only: the launch directory (read-write, at /launch), the harness (read-only), the
Python installation and /usr (read-only), and, on GPU launches, exactly the launch's GPUs. Deadline: the
launcher inside stops its ranks at the launch's deadline; outside, the container is killed shortly
after and always force-removed. A launch whose launcher ended cleanly (`SandboxLaunch.ended`: its
record written, every rank ended ok, so that only the launcher's exit is left) has its container
removed in the background, so the engine's teardown of it is not part of the launch's time.
Containers with our label left by a crashed server are removed when a backend starts (containers of
other live pkb processes on the same engine are left alone).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import docker
import docker.errors
import requests.exceptions
from docker.types import DeviceRequest, Mount, Ulimit

from harness.contracts import LaunchConfig
from harness.extensions import VIEW
from harness.launch import TOOL_MODES, setup_of
from sandbox.backend import Backend
from sandbox.base import (
    CONFIG_NAME,
    FILE_SIZE_CAP,
    LAUNCH_ENV,
    LOG_CAP_BYTES,
    OUTER_GRACE_S,
    DiskGuard,
    SandboxLaunch,
    SandboxRun,
    parse_size,
    sandbox_memory,
    write_config,
)
from sandbox.cpus import union as cpus_union
from sandbox.image import SANDBOX_GID, SANDBOX_UID, ensure_image
from sandbox.pool import Pooled, WarmSlot
from sandbox.toolchain import extra_mounts, jit_env

LABEL = "pkb.sandbox"
LAUNCH_LABEL = "pkb.launch"  # the id of the launch, or of the warm slot, that the container serves
LAUNCH_MOUNT = "/launch"
HARNESS_MOUNT = "/opt/pkb"
# Limits per launch, overridable by environment: processes, /dev/shm (NCCL's shared-memory transport
# needs room). Memory (RAM + swap, the tmpfs folders included) is fitted to the node:
# sandbox.base.sandbox_memory.
DEFAULT_LIMITS = {"PKB_SANDBOX_PIDS": "512", "PKB_SANDBOX_SHM": "8g"}


def _limit(name: str) -> str:
    return os.environ.get(name, DEFAULT_LIMITS[name])


def memory_limits() -> tuple[int, int, int]:
    """(memory, /tmp, /dev/shm) in bytes for one container: tmpfs pages are charged to the
    container's memory, so neither folder may be larger than what the container may hold (/tmp at
    most half of it, /dev/shm at most a quarter or PKB_SANDBOX_SHM)."""
    memory = sandbox_memory()
    return memory, min(16 << 30, memory // 2), min(parse_size(_limit("PKB_SANDBOX_SHM")), memory // 4)


NVIDIA_DRIVER_DIRS = ("/usr/local/nvidia",)
LIBCUDA_SEARCH = (
    *(f"{d}/{sub}" for d in NVIDIA_DRIVER_DIRS for sub in ("lib64", "lib")),
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)


def _libcuda_dir() -> str | None:
    """The folder holding the driver's libcuda.so.1 as the container sees it. Triton looks for it
    with `/sbin/ldconfig -p`, which the container has neither the binary nor the cache for; the
    folder is passed as TRITON_LIBCUDA_PATH instead."""
    for d in LIBCUDA_SEARCH:
        if os.path.exists(os.path.join(d, "libcuda.so.1")):
            return d
    return None


class DockerUnavailable(RuntimeError):
    """No Docker engine answers."""


# an engine call once the engine answered: starting a container on a busy node can take seconds
API_TIMEOUT_S = 60


def connect(timeout_s: float = 3.0) -> docker.DockerClient:
    """A client of the local engine, which must answer a ping within `timeout_s`; its later calls
    may take up to API_TIMEOUT_S (a container's start waited more than 3 s on a loaded 2-core
    machine while warm sandboxes started)."""
    try:
        client = docker.from_env(timeout=int(max(timeout_s, 1)))
        client.ping()
        client.api.timeout = API_TIMEOUT_S
        return client
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise DockerUnavailable(f"no Docker engine answers ({exc})") from exc


OWNER_LABEL = "pkb.owner"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's engine state, or no owner: not ours to keep
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphans(client: docker.DockerClient) -> list[Any]:
    """Containers with our label whose owning pkb process is gone (its watcher may be removing them)."""
    return [
        c
        for c in client.containers.list(all=True, filters={"label": LABEL})
        if not _owner_alive(c.labels.get(OWNER_LABEL, ""))
    ]


def sweep(client: docker.DockerClient) -> int:
    """Remove containers with our label whose owning pkb process is gone (left by a dead server).
    Containers of live pkb processes sharing the engine are left alone."""
    removed = 0
    for container in orphans(client):
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
            removed += 1
    return removed


def _python_prefixes() -> list[str]:
    """The interpreter's installation (and a virtual environment's base), mounted read-only."""
    prefixes = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(p for p in prefixes if not p.startswith("/usr"))


def _gpu_setup(client: docker.DockerClient, gpus: list[int]) -> dict[str, Any]:
    """Exactly the launch's GPUs: the NVIDIA runtime's device request where it is installed, else the
    device nodes themselves plus the driver's library folder, read-only."""
    if not gpus:
        return {}
    runtimes = client.info().get("Runtimes", {})
    ids = [str(g) for g in gpus]
    libcuda = _libcuda_dir()
    if "nvidia" in runtimes:
        return {
            "device_requests": [DeviceRequest(device_ids=ids, capabilities=[["gpu", "compute", "utility"]])],
            "environment": {"TRITON_LIBCUDA_PATH": libcuda} if libcuda else {},
        }
    # each node keeps its name: the driver opens /dev/nvidia<minor>, so a renamed node is no GPU at all
    devices = [f"/dev/nvidia{g}:/dev/nvidia{g}" for g in gpus]
    for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        if os.path.exists(node):
            devices.append(f"{node}:{node}")
    mounts = [Mount(d, d, type="bind", read_only=True) for d in NVIDIA_DRIVER_DIRS if os.path.isdir(d)]
    # CUDA numbers the GPUs it can open from 0: exactly the launch's
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus)))}
    if libcuda:
        env["TRITON_LIBCUDA_PATH"] = libcuda
    return {"devices": devices, "mounts": mounts, "environment": env}


def _inside(value: Any, host_dir: str) -> Any:
    """The launch config with host paths of the launch directory rewritten to the container's."""
    if isinstance(value, str):
        return value.replace(host_dir, LAUNCH_MOUNT)
    if isinstance(value, dict):
        return {k: _inside(v, host_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_inside(v, host_dir) for v in value]
    return value


def _rank_setup(config: dict[str, Any]) -> dict[str, Any] | None:
    """What the ranks of a launch (its config as the container sees it) are forked with, before their
    launcher reads the launch: nothing secret. None for a tool launch or a counter launch (whose ranks
    start under Nsight Compute), which start as they always did."""
    if config.get("mode") in TOOL_MODES or "counters" in config or "world_size" not in config:
        return None
    return dict(setup_of(cast(LaunchConfig, config)))


WAIT_CALL_S = 0.25  # one engine call waiting for a container's exit
ENDED_POLL_S = 0.005  # how often the launch directory is read for the launcher's clean end


@dataclass
class Ending:
    """How the wait for a launch's end ended."""

    exit_code: int | None = None  # the container's exit status; None if it was not seen to exit
    clean: bool = False  # the launcher's clean end was read (SandboxLaunch.ended): its exit not awaited
    killed: bool = False  # the deadline passed
    cancelled: bool = False
    exceeded: str | None = None  # a limit of the node's that the launch went past (DiskGuard)


def _await_end(
    container: Any, launch: SandboxLaunch, cancel: threading.Event | None, deadline: float
) -> Ending:
    """Wait for the container's exit, the launcher's clean end (`launch.ended`), the deadline or
    `cancel`. A thread of its own waits for the exit (the engine answers a wait call when the
    container has exited), so that a clean end is seen within ENDED_POLL_S of the launcher's record;
    the launcher's exit and the engine's teardown of the container take 50-150 ms more."""
    exited, stop = threading.Event(), threading.Event()
    codes: list[int] = []
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            while not stop.is_set():
                try:
                    codes.append(int(container.wait(timeout=WAIT_CALL_S)["StatusCode"]))
                    return
                except (requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout):
                    continue
        except BaseException as exc:  # the engine's answer is the caller's to raise
            errors.append(exc)
        finally:
            exited.set()

    threading.Thread(target=watch, name="pkb-container-wait", daemon=True).start()
    disk = DiskGuard(launch.launch_dir)
    try:
        while not exited.wait(ENDED_POLL_S if launch.ended is not None else WAIT_CALL_S):
            if launch.ended is not None and launch.ended(launch.launch_dir):
                return Ending(exit_code=0, clean=True)  # the launcher exits 0 after its record
            if cancel is not None and cancel.is_set():
                return Ending(cancelled=True)
            if time.monotonic() > deadline:
                return Ending(killed=True)
            if (over := disk.over()) is not None:
                return Ending(exceeded=over)
    finally:
        stop.set()
    if errors:
        raise errors[0]
    return Ending(exit_code=codes[0] if codes else None)


class Removals:
    """Containers of launches that ended cleanly, force-removed by threads of their own: the engine's
    teardown of a container is not the launch's wait. `drain` waits for them (a test that counts
    containers, a server shutting down); one left by a server that died is swept at the next start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    def add(self, container: Any) -> None:
        thread = threading.Thread(
            target=self._remove, args=(container,), name="pkb-container-rm", daemon=True
        )
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _remove(self, container: Any) -> None:
        try:
            with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                container.remove(force=True)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def drain(self, timeout_s: float = API_TIMEOUT_S) -> None:
        """Return once every removal has finished (or at the timeout)."""
        give_up = time.monotonic() + timeout_s
        while (left := give_up - time.monotonic()) > 0:
            with self._lock:
                pending = list(self._threads)
            if not pending:
                return
            pending[0].join(left)


removals = Removals()  # one per process: its containers carry its owner label (sweep)
atexit.register(removals.drain, 10.0)


class DockerBackend(Pooled, Backend):
    name = "docker"
    isolated = True
    ends_early = True  # returns at a launch's clean end (SandboxLaunch.ended), its container removed later
    note = "docker backend: no network, read-only root, non-root user, no capabilities, resource limits"

    def __init__(self, client: docker.DockerClient | None = None):
        self.client = client or connect()
        self.image = ensure_image(self.client)
        sweep(self.client)

    def _start(
        self,
        launch_id: str,
        launch_dir: Path,
        device: str,
        gpus: list[int],
        threads: int,
        cpus: tuple[tuple[int, ...], ...],
        harness_root: Path,
        warm: dict[str, Any] | None,
        ranks: dict[str, Any] | None = None,
    ) -> Any:
        """Create and start the launch's container; a warm one waits inside for its launch file; a
        launch's own, given its ranks' set-up (`ranks`: harness.launch setup_of, nothing secret),
        forks its ranks from its launcher."""
        command = [sys.executable, "-m", "harness.launch", "--config-file", f"{LAUNCH_MOUNT}/{CONFIG_NAME}"]
        if warm is not None:
            command += ["--warm", json.dumps(_inside(warm, str(launch_dir)))]
        elif ranks is not None:  # forked from the launcher, torch imported once (harness/launch.py)
            command += ["--ranks", json.dumps(ranks)]
        options = self.container_options(launch_id, launch_dir, device, gpus, threads, cpus, harness_root)
        container = self.client.containers.create(self.image, command, **options)
        try:
            container.start()
        except BaseException:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            raise
        return container

    def container_options(
        self,
        launch_id: str,
        launch_dir: Path,
        device: str,
        gpus: list[int],
        threads: int,
        cpus: tuple[tuple[int, ...], ...],
        harness_root: Path,
    ) -> dict[str, Any]:
        """Everything a launch's container is created with but its image and command (the launch
        directory handed over to the sandbox user): bench/scripts/gpu_step.py takes the same."""
        host_dir = str(launch_dir)
        self._hand_over(launch_dir)
        gpu = _gpu_setup(self.client, gpus if device == "cuda" else [])
        env = dict(LAUNCH_ENV)
        env.update(
            {
                "HOME": "/tmp",
                "PYTHONPATH": HARNESS_MOUNT,
                "PKB_LAUNCH": launch_id,
                "TMPDIR": "/tmp",
                "TORCH_EXTENSIONS_DIR": "/tmp/torch_extensions",
                "TRITON_CACHE_DIR": "/tmp/triton",
                "OMP_NUM_THREADS": str(threads),
                **jit_env(),  # PATH with ninja and nvcc, CUDA_HOME, the node's GPU architectures
            }
        )
        env["CUDA_VISIBLE_DEVICES"] = "" if device != "cuda" else ",".join(str(i) for i in range(len(gpus)))
        env.update(gpu.get("environment", {}))
        mounts = [
            Mount(LAUNCH_MOUNT, host_dir, type="bind", read_only=False),
            Mount(f"{HARNESS_MOUNT}/harness", str(harness_root / "harness"), type="bind", read_only=True),
            Mount("/usr", "/usr", type="bind", read_only=True),
            *[Mount(p, p, type="bind", read_only=True) for p in _python_prefixes()],
            *[Mount(p, p, type="bind", read_only=True) for p in extra_mounts()],
            *gpu.get("mounts", []),
        ]
        if self.extensions_dir is not None:
            # the node's cache is never mounted: each launch sees only its own entries, which the host
            # links into the launch directory's view before the hand-over (pkb_mcp/extension_view.py
            # show_entries), so a warm container, made before its launch is known, finds them too
            env["PKB_EXTENSIONS"] = f"{LAUNCH_MOUNT}/{VIEW}"
        memory, tmp_size, shm_size = memory_limits()
        return dict(
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            working_dir=LAUNCH_MOUNT,
            environment=env,
            mounts=mounts,
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,exec,nosuid,size={tmp_size},mode=1777"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=int(_limit("PKB_SANDBOX_PIDS")),
            mem_limit=memory,
            memswap_limit=memory,
            shm_size=shm_size,
            # no file larger than FILE_SIZE_CAP (the launch folder as a whole: DiskGuard), no core dumps
            ulimits=[
                Ulimit(name="fsize", soft=FILE_SIZE_CAP, hard=FILE_SIZE_CAP),
                Ulimit(name="core", soft=0, hard=0),
            ],
            init=True,
            ipc_mode="private",
            labels={LABEL: "1", LAUNCH_LABEL: launch_id, OWNER_LABEL: owner_id()},
            cpuset_cpus=cpus_union(cpus) or None,  # a rank cannot widen its cores beyond the launch's
            devices=gpu.get("devices"),
            device_requests=gpu.get("device_requests"),
            stdin_open=False,
            tty=False,
        )

    @staticmethod
    def _alive(container: Any) -> bool:
        try:
            container.reload()
            return container.status in ("created", "running")
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return False

    @staticmethod
    def _describe(slot: WarmSlot) -> str:
        """How a container that stopped ended: its state and the launcher's last lines."""
        container = slot.handle
        if container is None:
            return "never started"
        container.reload()
        state = container.attrs.get("State", {})
        logs = container.logs(stdout=True, stderr=True, tail=40).decode("utf-8", "replace")
        return (
            f"status {container.status}, exit code {state.get('ExitCode')}, "
            f"OOM-killed {state.get('OOMKilled')}, error {state.get('Error')!r}; launcher: {logs}"
        )

    def _discard(self, slot: WarmSlot) -> None:
        if slot.handle is not None:
            with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                slot.handle.remove(force=True)
        shutil.rmtree(slot.launch_dir, ignore_errors=True)

    def run(self, launch: SandboxLaunch, cancel: threading.Event | None = None) -> SandboxRun:
        t0 = time.monotonic()
        config = _inside(launch.config, str(launch.launch_dir))
        if launch.warm is not None:
            container = launch.warm
            self._hand_over(launch.launch_dir)  # the files written since it started
            write_config(launch.launch_dir, config, (SANDBOX_UID, SANDBOX_GID))  # its launcher waits for it
        else:
            write_config(launch.launch_dir, config, (SANDBOX_UID, SANDBOX_GID))
            container = self._start(
                launch.launch_id,
                launch.launch_dir,
                launch.device,
                launch.gpus,
                launch.threads,
                launch.cpus,
                launch.harness_root,
                None,
                _rank_setup(config),
            )
        steps = {"handed_over": round(time.monotonic() - t0, 3)}
        end = Ending()
        log = ""
        try:
            end = _await_end(container, launch, cancel, t0 + launch.timeout_s + OUTER_GRACE_S)
            steps["ended_cleanly" if end.clean else "exited"] = round(time.monotonic() - t0, 3)
            if end.exit_code is None and not end.clean:
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
            try:
                log = container.logs(stdout=True, stderr=True, tail=2000)[-LOG_CAP_BYTES:].decode(
                    "utf-8", "replace"
                )
            except docker.errors.APIError as exc:  # removed under us (a sweep as the server stops)
                log = f"(its container's log could not be read: {str(exc)[:200]})"
            steps["logs_read"] = round(time.monotonic() - t0, 3)
        finally:
            if end.clean:
                removals.add(container)
            else:
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
                steps["removed"] = round(time.monotonic() - t0, 3)
        return SandboxRun(
            exit_code=end.exit_code,
            wall_s=time.monotonic() - t0,
            killed_at_deadline=end.killed,
            launcher_log=log,
            cancelled=end.cancelled,
            exceeded=end.exceeded,
            warm=launch.warm is not None,
            steps_s=steps,
        )

    @staticmethod
    def settle_ended() -> None:
        """Return once every container of a launch that ended cleanly is gone (a benchmark is next)."""
        removals.drain()

    def end_all(self, timeout_s: float) -> int:
        """Remove every container that carries this process's owner label, all at once, warm or
        running, and wait for those removals and the background ones (Removals) up to `timeout_s`."""
        self.disable_pool()
        give_up = time.monotonic() + timeout_s
        try:
            mine = self.client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_id()}"})
        except (docker.errors.APIError, requests.exceptions.RequestException):
            mine = []
        for container in mine:
            removals.add(container)
        removals.drain(max(0.0, give_up - time.monotonic()))
        return len(mine)

    @staticmethod
    def _hand_over(launch_dir: Path) -> None:
        """Give the launch directory to the sandbox user (or open it up when we cannot chown), all but
        its view of the extension cache: hard links to the cache's own files, which must stay the
        host's and unwritable by the launch (a chown or a chmod would change the cache itself)."""
        view = launch_dir / VIEW
        for path in [launch_dir, *launch_dir.rglob("*")]:
            if path == view or view in path.parents:
                continue
            if path.is_symlink():
                continue  # the host makes no links there; whatever made one gets nothing through it
            try:
                os.chown(path, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
            except PermissionError:
                os.chmod(path, 0o777 if path.is_dir() else 0o666)
