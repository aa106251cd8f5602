"""One rank of a launch: process group, inputs, the solution, outputs and timings (torch + stdlib only).

Started by harness.launch, it reads two JSON lines on stdin: the set-up (a RankSetup: rank, world size,
device), then the launch (a RankConfig: problem, solution, seeds: stdin is the only place this rank's
seeds exist), each checked against harness/contracts.py. Between
the two it imports torch, creates the process group and runs one collective, then writes
rank{rank}.ready: a warm sandbox started ahead of need waits there for its one launch (a gated one
first writes rank{rank}.staged and waits for a go line before it touches the GPU). It writes into
the launch directory:
  out/t{trial}_r{rank}.pkbt   outputs of each correctness trial (mode "outputs"; a reference's
                              later trials, contracts.LaterTrials, numbered after its own)
  out/s{set}_r{rank}.pkbt     first output of each timed input set (mode "benchmark")
  timing.json                 samples, written by rank 0 (mode "benchmark")
  profile/r{rank}.*           the rank's profiler trace, call times and NVLink counts (mode "profile",
                              harness/profile.py)
  rank{rank}.status.json      its part of the rank's RankRecord: "ok", or the failure with a trimmed
                              traceback; the launcher completes it for launch.json
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from harness import forking
from harness.calls import Calls, SolutionError, snapshot
from harness.contracts import (
    GO_LINE,
    ContractError,
    RankConfig,
    RankRecord,
    RankSetup,
    TimingRecord,
    read_rank_config,
    read_rank_setup,
)
from harness.counters import WORKER_TMPDIR

HARNESS_DIR = Path(__file__).resolve().parent
ORIGINAL_PACKAGES = str(HARNESS_DIR / "original")  # harness/original: the original benchmark's `utils`


def _trimmed_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames: what the candidate's author needs."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(str(HARNESS_DIR))
    ]
    text = "".join(traceback.format_list(frames[-12:]))
    text += "".join(traceback.format_exception_only(type(exc), exc))
    return text[-6000:]


def finished_status(
    t_start: float, cpus: list[int], stages: Stages, startup: dict[str, float] | None = None
) -> RankRecord:
    """This rank's part of its RankRecord when its launch ran to the end."""
    return {
        "state": "ok",
        "elapsed_s": time.monotonic() - t_start,
        "cpus": cpus,
        "stages": stages.durations(),
        "startup_s": startup,
    }


def failed_status(
    exc: BaseException,
    stage: str,
    t_start: float,
    cpus: list[int],
    stages: Stages,
    startup: dict[str, float] | None = None,
) -> RankRecord:
    """This rank's part of its RankRecord when `exc` ended it in `stage`."""
    return {
        "state": "error",
        "stage": stage,
        "error": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": _trimmed_traceback(exc),
        "elapsed_s": time.monotonic() - t_start,
        "cpus": cpus,
        "stages": stages.durations(),
        "startup_s": startup,
    }


def process_age() -> float | None:
    """Seconds since this process started (a new interpreter's start, or its fork), from the kernel's
    record of its start; None where /proc does not say (Linux only)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat, counted after comm
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError):
        return None


def _write_status(launch_dir: Path, rank: int, status: RankRecord) -> None:
    path = launch_dir / f"rank{rank}.status.json"
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def load_module(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _connect_store(launch_dir: Path, rank: int, world_size: int, timeout_s: float):
    """Rank 0 opens a TCP store on a port the kernel picks; the others read it from the launch dir."""
    import datetime

    import torch.distributed as dist

    port_file = launch_dir / "store_port"
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        tmp = launch_dir / "store_port.part"
        tmp.write_text(str(store.port))
        os.replace(tmp, port_file)
        return store
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 never published the store port")
        time.sleep(0.01)
    return dist.TCPStore(
        "127.0.0.1", int(port_file.read_text()), world_size, is_master=False, timeout=timeout
    )


class Stages:
    """Seconds a rank spends in each stage of its launch, from the launch's arrival: the host logs them,
    so that a slow launch shows where its time went (loading, inputs, judged calls, timing, teardown)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.label: str | None = None  # the current stage, as an error in it reports it
        self._name: str | None = None
        self._since = time.monotonic()

    def enter(self, name: str, label: str | None = None) -> str:
        """Start stage `name` (its time adds to earlier stretches of the same name); returns
        `label`, else `name`: what an error in it reports."""
        self._close()
        self._name = name
        self.label = label or name
        return self.label

    def durations(self) -> dict[str, float]:
        self._close()
        return {k: round(v, 4) for k, v in self.spent.items()}

    def _close(self) -> None:
        now = time.monotonic()
        if self._name is not None:
            self.spent[self._name] = self.spent.get(self._name, 0.0) + now - self._since
        self._since = now


# ------------------------------------------------------------------ defences against the solution
# The solution runs in this process: it can replace what the harness measures with or judges by,
# leave work running past its return, spawn processes that outlive it, or rewrite result files.


class Watch:
    """Identity of every clock, torch function and harness attribute the harness relies on, taken
    before the solution is imported; `check` fails the rank if the solution replaced any of them."""

    def __init__(self, problem: ModuleType | None = None) -> None:
        import builtins

        import torch
        import torch.distributed as dist

        from harness import benchmark, calls, context, convention, structure, tensorfile, timing

        owners: dict[str, Any] = {
            "time": (time, ["perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "sleep"]),
            "os": (os, ["replace", "_exit", "kill", "waitpid", "getpid"]),
            "json": (json, ["dumps", "loads"]),
            "builtins": (builtins, ["open", "isinstance", "len", "max", "min", "sum", "zip", "float"]),
            "torch": (
                torch,
                ["equal", "allclose", "isnan", "isfinite", "tensor", "empty", "zeros", "ones", "device"],
            ),
            "torch.Tensor": (
                torch.Tensor,
                [
                    "clone",
                    "to",
                    "copy_",
                    "detach",
                    "contiguous",
                    "reshape",
                    "view",
                    "tolist",
                    "item",
                    "numel",
                    "element_size",
                    "untyped_storage",
                    "data_ptr",
                    "any",
                    "fill_",
                ],
            ),
            "torch.cuda": (
                torch.cuda,
                ["synchronize", "Event", "Stream", "current_stream", "stream", "set_stream", "_sleep"],
            ),
            "torch.cuda.Event": (torch.cuda.Event, ["record", "synchronize", "elapsed_time", "query"]),
            "torch.distributed": (
                dist,
                ["barrier", "all_reduce", "destroy_process_group", "get_rank", "get_world_size", "ReduceOp"],
            ),
        }
        # every global of the harness's own modules (functions, classes, the modules they use)
        for label, module in [
            ("harness.timing", timing),
            ("harness.tensorfile", tensorfile),
            ("harness.structure", structure),
            # the outputs taken plain at return (calls.returning_plain) and the calls that judge them
            ("harness.calls", calls),
            ("harness.benchmark", benchmark),
            ("harness.context", context),
            ("harness.convention", convention),
            ("harness.forking", forking),
            ("harness.worker", sys.modules[__name__]),  # __main__ when run with -m
        ]:
            owners[label] = (module, [n for n in vars(module) if not n.startswith("__")])
        if problem is not None:  # the problem's hooks the harness calls on a candidate's outputs
            owners["the problem"] = (problem, ["canonical"])
        for label, cls in [("harness.timing.Timer", timing.Timer), ("harness.calls.Calls", calls.Calls)]:
            owners[label] = (cls, [n for n in vars(cls) if not n.startswith("__")])
        self._seen = [
            (f"{label}.{name}", owner, name, getattr(owner, name))
            for label, (owner, names) in owners.items()
            for name in names
            if hasattr(owner, name)
        ]

    def check(self, when: str) -> None:
        for label, owner, name, original in self._seen:
            if getattr(owner, name, None) is not original:
                raise SolutionError(
                    f"the solution replaced {label} ({when}); patching clocks, torch, torch.distributed "
                    "or the harness is not allowed"
                )


def _exit_now(code: int) -> None:
    """Leave at once: threads the solution started end here, before they can touch a result file."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def read_line(stream: Any) -> object:
    """The next JSON line; None at the end of the stream or for an empty line."""
    line = stream.readline()
    return json.loads(line) if line.strip() else None


def run(setup: RankSetup, next_launch: Callable[[], object]) -> None:
    """This rank's life: the process group, then one launch (or none, for a warm sandbox never used),
    its status written whatever happens."""
    import torch.distributed as dist

    from harness import tensorfile

    rank, world_size = setup["rank"], setup["world_size"]
    launch_dir = Path(setup["launch_dir"])
    stage = "setup"
    t_start = time.monotonic()
    age = process_age()
    stages = Stages()  # restarted when the launch arrives: a warm sandbox's start is no part of it
    cpus = sorted(os.sched_getaffinity(0))  # where the launcher put this rank, before any solution ran
    startup: dict[str, float] | None = None
    try:
        stage = "process group"
        device = _join_group(setup, launch_dir, next_launch)
        if not setup["warm"]:  # a cold launch's start is part of its time: the host logs it
            startup = {"group": round(time.monotonic() - t_start, 4)}
            if age is not None:
                startup["process"] = round(age, 4)
        if device is None:  # a gated warm sandbox that was never used
            os._exit(0)
        stage = "waiting for the launch"
        launch = next_launch()
        if launch is None:  # a warm sandbox that was never used
            dist.destroy_process_group()
            os._exit(0)
        t_start = time.monotonic()
        stages = Stages()
        cfg = read_rank_config(launch)
        cfg["rank"], cfg["world_size"] = rank, world_size
        record = _run_launch(cfg, device, launch_dir, stages)
        stages.enter("teardown")
        # Every rank past its last call before any leaves (a peer may still read this rank's memory).
        # The process group is not destroyed: the exit below frees it, and destroying NCCL's
        # communicators took a warm check's launches 0.1-0.5 s each (2 H200s, 2026-11-27).
        dist.barrier()
        # Last writes: after every process the solution forked is gone, and followed at once by the
        # exit that ends its threads; the timing record carries the keyed digest the host checks.
        forking.reap_descendants()
        if record is not None and rank == 0:
            tmp = launch_dir / "timing.part"
            signed = cast(TimingRecord, tensorfile.mac_record(tensorfile.result_key(cfg["seeds"]), record))
            tmp.write_text(json.dumps(signed))
            os.replace(tmp, launch_dir / "timing.json")
        _write_status(launch_dir, rank, finished_status(t_start, cpus, stages, startup))
        _exit_now(0)
    except BaseException as exc:  # report every failure of this rank, then exit non-zero
        failed = failed_status(exc, stages.label or stage, t_start, cpus, stages, startup)
        _write_status(launch_dir, rank, failed)
        sys.stderr.write(_trimmed_traceback(exc))
        sys.stderr.flush()
        forking.reap_descendants()
        os._exit(3)


def _join_group(setup: RankSetup, launch_dir: Path, next_message: Callable[[], object]) -> Any:
    """The process group, with one collective run (communicators, CUDA context and allocator are
    ready before the launch arrives); then rank{rank}.ready, with how long each took
    (contracts.READY_STEPS). Returns this rank's device, or None for
    a gated sandbox let go without a launch (`next_message` reads the go line)."""
    import torch
    import torch.distributed as dist

    rank, world_size = setup["rank"], setup["world_size"]
    if setup["warm"]:
        # what a solution's load_inline costs besides its extension: the module and setuptools, a
        # few tenths of a second a rank. A cold launch leaves it to the solutions that use it.
        import torch.utils.cpp_extension
    store = _connect_store(launch_dir, rank, world_size, setup["setup_timeout_s"])
    if setup.get("gated"):
        # what needs no GPU is done: the GPU waits for the host (a benchmark may be timing on it)
        (launch_dir / f"rank{rank}.staged").write_text("")
        go = next_message()
        if go is None:
            return None
        if go != GO_LINE:
            raise ContractError(f"a gated rank's second line must be the go line, not {go!r}")
    steps: dict[str, float] = {}
    t = time.monotonic()
    if setup["device"] == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        torch.empty(1, device=device)  # the context and the allocator, no kernel
        steps["context_s"] = time.monotonic() - t
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, setup["threads_per_rank"]))
    init_kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    backend = "nccl" if device.type == "cuda" else "gloo"
    t = time.monotonic()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **init_kwargs)
    if backend == "gloo":
        from harness import gloo_as_nccl

        gloo_as_nccl.install()  # the all-gathers NCCL takes and gloo refuses, for the original's files
    steps["group_s"] = time.monotonic() - t
    t = time.monotonic()
    dist.all_reduce(torch.ones(1, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    steps["collective_s"] = time.monotonic() - t
    part = launch_dir / f"rank{rank}.ready.part"
    part.write_text(json.dumps({k: round(v, 4) for k, v in steps.items()}))
    os.replace(part, launch_dir / f"rank{rank}.ready")  # whole when it appears
    return device


def _run_launch(cfg: RankConfig, device: Any, launch_dir: Path, stages: Stages) -> TimingRecord | None:
    """Load the problem and the solution, then run the launch's mode: "outputs" (the judged trials),
    "profile" or "benchmark". Returns the benchmark's timing record (else None)."""
    if "later" in cfg and (cfg["mode"] != "outputs" or cfg["solution_path"] != cfg["problem_path"]):
        raise ContractError("only the problem's reference runs later trials, in a launch of mode outputs")
    stages.enter("setup")
    problem = load_module(cfg["problem_path"], "pkb_problem")
    watch = Watch(problem)
    forking.become_subreaper()  # what the solution forks, even twice, stays a descendant of this rank
    stages.enter("import")
    if cfg["solution_path"] == cfg["problem_path"]:
        solution = problem.solution
    else:
        from harness import convention, extensions

        extensions.install()  # its load_inline builds once, into the node's cache
        sys.path.append(ORIGINAL_PACKAGES)  # utils.cuda_helpers of original-benchmark files
        candidate = load_module(cfg["solution_path"], "solution")
        solution = getattr(candidate, "solution", None)
        if not callable(solution):
            raise SolutionError("the solution file defines no callable named solution")
        solution = convention.bind(solution, problem, cfg, device)  # ours, or the original's call
    watch.check("while being imported")
    out_dir = launch_dir / "out"
    out_dir.mkdir(exist_ok=True)
    calls = Calls(problem, solution, cfg, device, out_dir, watch.check)
    if cfg["mode"] == "outputs":
        _trials(calls, cfg["seeds"], 0, stages)
        first = len(cfg["seeds"])
        for group in cfg.get("later", []):
            at = cast(RankConfig, {**cfg, "size": group["size"], "seeds": group["seeds"]})
            _trials(Calls(problem, solution, at, device, out_dir, watch.check), group["seeds"], first, stages)
            first += len(group["seeds"])
        return None
    if cfg["mode"] == "profile":
        from harness import profile  # where each call's time goes (docs/plan-profile.md)
        from harness.context import derive_seed

        stages.enter("profile")
        profiled = calls.make(derive_seed(cfg["seeds"][0], "set", 0))
        profile.run(
            solution,
            lambda: snapshot(profiled) if calls.mutates else profiled,
            device,
            calls.timing,
            launch_dir,
            calls.rank,
            after_call=lambda: watch.check("while being profiled"),
            plan=cfg.get("counters"),  # a counter launch: this rank runs under ncu (harness/counters.py)
        )
        return None
    from harness import benchmark

    return benchmark.run(calls, stages.enter)


def _trials(calls: Calls, seeds: list[int], first: int, stages: Stages) -> None:
    """One judged call on fresh inputs for each seed; the outputs of trial `first + i` in
    out/t{first + i}_r{rank}."""
    import torch.distributed as dist

    for i, seed in enumerate(seeds):
        stages.enter("trials", f"trial {first + i}")
        inputs = calls.make(seed)
        dist.barrier()
        structure, outs, meta = calls.judge_call(inputs)
        calls.save(f"t{first + i}", outs, structure, meta)
        del inputs, outs


def main() -> None:
    # the launcher sends SIGUSR1 before killing a stuck rank: its stacks land in the rank's log
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    shared_tmp = os.environ.pop(WORKER_TMPDIR, None)
    if shared_tmp:  # under ncu (harness/counters.py): the launch's TMPDIR, which the ranks share
        os.environ["TMPDIR"] = shared_tmp
    line = read_line(sys.stdin)
    if line is None:
        sys.exit("harness.worker: no set-up line on stdin")
    try:
        setup = read_rank_setup(line)
    except ContractError as exc:
        sys.exit(f"harness.worker: {exc}")
    run(setup, lambda: read_line(sys.stdin))


if __name__ == "__main__":
    main()
