"""One rank of a job: process group, inputs, the solution, outputs and timings (torch + stdlib only).

Started by harness.launch, it reads two JSON lines on stdin: the set-up (rank, world size, device),
then the job (problem, solution, seeds: stdin is the only place this rank's seeds exist). Between
the two it imports torch, creates the process group and runs one collective, then writes
rank{rank}.ready: a warm sandbox started ahead of need waits there for its one job. It writes into
the job directory:
  out/t{trial}_r{rank}.pkbt   outputs of each correctness trial (mode "outputs")
  out/s{set}_r{rank}.pkbt     first output of each timed input set (mode "benchmark")
  timing.json                 samples, written by rank 0 (mode "benchmark")
  profile/r{rank}.*.json      the rank's profiler trace and call times (mode "profile", harness/profile.py)
  rank{rank}.status.json      "ok", or the failure with a trimmed traceback
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HARNESS_DIR = Path(__file__).resolve().parent
ORIGINAL_PACKAGES = str(HARNESS_DIR / "original")  # harness/original: the original benchmark's `utils`


class SolutionError(Exception):
    """The solution returned something outside the contract."""


def _trimmed_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames: what the candidate's author needs."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(str(HARNESS_DIR))
    ]
    text = "".join(traceback.format_list(frames[-12:]))
    text += "".join(traceback.format_exception_only(type(exc), exc))
    return text[-6000:]


def _write_status(job_dir: Path, rank: int, status: dict[str, Any]) -> None:
    path = job_dir / f"rank{rank}.status.json"
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


def _connect_store(job_dir: Path, rank: int, world_size: int, timeout_s: float):
    """Rank 0 opens a TCP store on a port the kernel picks; the others read it from the job dir."""
    import datetime

    import torch.distributed as dist

    port_file = job_dir / "store_port"
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        tmp = job_dir / "store_port.part"
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


def _snapshot(inputs: tuple) -> tuple:
    import torch

    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)


class Stages:
    """Seconds a rank spends in each stage of its job, from the job's arrival: the host logs them,
    so that a slow job shows where its time went (loading, inputs, judged calls, timing, teardown)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._name: str | None = None
        self._since = time.monotonic()

    def enter(self, name: str, label: str | None = None) -> str:
        """Start stage `name` (its time adds to earlier stretches of the same name); returns
        `label`, else `name`: what an error in it reports."""
        self._close()
        self._name = name
        return label or name

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

    def __init__(self) -> None:
        import builtins

        import torch
        import torch.distributed as dist

        from harness import context, convention, tensorfile, timing

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
            ("harness.context", context),
            ("harness.convention", convention),
            ("harness.worker", sys.modules[__name__]),  # __main__ when run with -m
        ]:
            owners[label] = (module, [n for n in vars(module) if not n.startswith("__")])
        owners["harness.timing.Timer"] = (
            timing.Timer,
            [n for n in vars(timing.Timer) if not n.startswith("__")],
        )
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


def _copy_at_return(outs: list, caller: Any) -> list:
    """The outputs as they are when solution() returns. On a GPU the copy is queued on the stream
    that was current at the call (the caller's), so work left running on a side stream, queued
    later by a thread, or remote writes that had not landed when the solution returned, are not in
    it: the contract is an output that is complete on the caller's stream at return."""
    import torch

    if caller is None:
        return [o.detach().clone() for o in outs]
    with torch.cuda.stream(caller):
        return [o.detach().clone() for o in outs]


def _input_rotation(sets: list[tuple]) -> Callable[[], list[int]] | None:
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


def _copy_into(dst: tuple, src: tuple) -> bool:
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


def fresh_calls(
    make: Callable[[Any], tuple],
    solution: Callable[..., Any],
    mutates: bool,
    save: Callable[[int, list, str, dict], None],
    max_calls: int,
    judged: set[int],
    aliasing: Callable[[list, list, int], list[int]],
) -> Any:
    """Timed calls on input sets never seen before (harness.timing.Fresh): fresh call k's inputs are
    made from the seed labelled k and copied into one set of fresh buffers, made once, so that their
    addresses stay the same from call to call (an honest solution that sets something up per address
    pays once, in the untimed warm-up call); the outputs of the calls in `judged` are saved for the
    host to judge, with the aliasing and mutation checks of a judged call (`aliasing(outputs, inputs,
    returned)`: the indices of returned outputs that break the contract). `make(label)` builds the
    inputs of a label."""
    import torch

    from harness import timing

    buffers = make("buffers")
    state: dict[str, Any] = {}

    def prepare(k: int) -> None:
        made = make("warmup" if k < 0 else k)
        copied = _copy_into(buffers, made)
        inputs = buffers if copied else made
        state["inputs"] = inputs
        state["pristine"] = made if copied else (None if mutates else _snapshot(made))

    def call() -> Any:
        return solution(*state["inputs"])

    def record(k: int, out: Any) -> None:
        if k not in judged:
            return
        inputs = list(state["inputs"])
        structure, outs = normalize_output(out)
        returned = len(outs)
        if mutates:  # the in-place result is part of the output
            outs = outs + [t for t in inputs if isinstance(t, torch.Tensor)]
        pristine = state["pristine"]
        meta: dict[str, Any] = {"aliased_outputs": aliasing(outs, inputs, returned)}
        meta["mutated_inputs"] = [] if mutates or pristine is None else mutated_inputs(inputs, list(pristine))
        save(k, [o.detach().clone() for o in outs], structure, meta)

    return timing.Fresh(prepare, call, record, max_calls)


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Processes the solution forks, even double-forked ones, stay this rank's descendants (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _children() -> list[int]:
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def _reap_descendants() -> int:
    """Kill every process the solution left behind (orphans came to us as the subreaper); how many."""
    killed = 0
    for _ in range(100):
        pids = _children()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        for pid in pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
    return killed


def _exit_now(code: int) -> None:
    """Leave at once: threads the solution started end here, before they can touch a result file."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def read_line(stream: Any) -> dict[str, Any] | None:
    line = stream.readline()
    return json.loads(line) if line.strip() else None


def run(setup: dict[str, Any], next_job: Callable[[], dict[str, Any] | None]) -> None:
    import torch
    import torch.distributed as dist

    from harness import convention, tensorfile, timing
    from harness.context import DTYPES, ProblemContext, derive_seed

    rank, world_size = setup["rank"], setup["world_size"]
    job_dir = Path(setup["job_dir"])
    out_dir = job_dir / "out"
    stage = "setup"
    t_start = time.monotonic()
    stages = Stages()  # restarted when the job arrives: a warm sandbox's start is no part of it
    cpus = sorted(os.sched_getaffinity(0))  # where the launcher put this rank, before any solution ran
    try:
        if setup["device"] == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            torch.set_num_threads(max(1, int(setup.get("threads_per_rank", 1))))
            backend = "gloo"
        stage = "process group"
        store = _connect_store(job_dir, rank, world_size, float(setup["setup_timeout_s"]))
        init_kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **init_kwargs)
        # one collective: communicators, CUDA context and allocator are ready before the job arrives
        dist.all_reduce(torch.ones(1, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize()
        (job_dir / f"rank{rank}.ready").write_text("")

        stage = "waiting for the job"
        job = next_job()
        if job is None:  # a warm sandbox that was never used
            dist.destroy_process_group()
            os._exit(0)
        cfg = {**job, "rank": rank}
        t_start = time.monotonic()
        stages = Stages()
        stage = stages.enter("setup")
        problem = load_module(cfg["problem_path"], "pkb_problem")
        mac_key = tensorfile.result_key(cfg["seeds"])  # the host checks every result file with it
        watch = Watch()
        _become_subreaper()
        stage = stages.enter("import")
        if cfg["solution_path"] == cfg["problem_path"]:
            solution = problem.solution
        else:
            from harness import extensions

            extensions.install()  # its load_inline builds once, into the node's cache
            sys.path.append(ORIGINAL_PACKAGES)  # utils.cuda_helpers of original-benchmark files
            candidate = load_module(cfg["solution_path"], "solution")
            solution = getattr(candidate, "solution", None)
            if not callable(solution):
                raise SolutionError("the solution file defines no callable named solution")
            solution = convention.bind(solution, problem, cfg, device)  # ours, or the original's call
        watch.check("while being imported")

        dtype = DTYPES[cfg["dtype"]]
        mutates = bool(getattr(problem, "MUTATES_INPUTS", False))

        def make(seed: int) -> tuple:
            ctx = ProblemContext(
                rank=rank, world_size=world_size, size=cfg["size"], dtype=dtype, device=device, seed=seed
            )
            inputs = problem.make_inputs(ctx)
            return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)

        def aliasing(outs: list, inputs: list, returned: int) -> list[int]:
            """The returned outputs whose memory overlaps an input's, less those the contract allows."""
            aliased = aliased_inputs(outs[:returned], inputs)
            return convention.aliasing_faults(problem, rank, world_size, outs, inputs, aliased)

        def in_place(outs: list, inputs: tuple) -> list:
            """The outputs judged: the returned ones, then the inputs a mutating workload updated."""
            return outs + [t for t in inputs if isinstance(t, torch.Tensor)] if mutates else outs

        def judge_call(inputs: tuple) -> tuple[str, list, dict[str, Any]]:
            """One checked call: the outputs as they were at return (private copies), plus what the
            host must know (aliasing, mutation)."""
            snaps = None if mutates else _snapshot(inputs)
            caller = torch.cuda.current_stream() if device.type == "cuda" else None
            result = solution(*inputs)
            watch.check("during a call")
            structure, outs = normalize_output(result)
            returned = len(outs)
            outs = in_place(outs, inputs)
            at_return = _copy_at_return(outs, caller)
            if caller is not None:
                torch.cuda.set_stream(caller)  # whatever stream the solution left current
                torch.cuda.synchronize()
            dist.barrier()  # every rank's work has ended before inputs are compared
            meta: dict[str, Any] = {"aliased_outputs": aliasing(outs, list(inputs), returned)}
            meta["mutated_inputs"] = [] if snaps is None else mutated_inputs(list(inputs), list(snaps))
            return structure, at_return, meta

        out_dir.mkdir(exist_ok=True)
        record: dict[str, Any] | None = None
        if cfg["mode"] == "outputs":
            for trial, seed in enumerate(cfg["seeds"]):
                stage = stages.enter("trials", f"trial {trial}")
                inputs = make(seed)
                dist.barrier()
                structure, outs, meta = judge_call(inputs)
                tensorfile.save(out_dir / f"t{trial}_r{rank}.pkbt", outs, structure, meta, key=mac_key)
                del inputs, outs
        elif cfg["mode"] == "profile":
            from harness import profile  # where each call's time goes (docs/plan-profile.md)

            stage = stages.enter("profile")
            profiled = make(derive_seed(cfg["seeds"][0], "set", 0))
            profile.run(
                solution,
                lambda: _snapshot(profiled) if mutates else profiled,
                device,
                cfg["timing"],
                job_dir,
                rank,
                after_call=lambda: watch.check("while being profiled"),
            )
        else:
            stage = stages.enter("benchmark inputs")
            tcfg = cfg["timing"]
            base = cfg["seeds"][0]
            first = make(derive_seed(base, "set", 0))
            nbytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
            nbytes = int(timing.max_over_ranks([float(nbytes)], device)[0])
            per_set = max(nbytes * (1 if mutates else 2), 1)
            want = max(2, -(-2 * tcfg["l2_bytes"] // max(nbytes, 1)))
            n_sets = int(max(2, min(want, tcfg["max_sets"], tcfg["rotation_bytes"] // per_set)))
            sets = [first] + [make(derive_seed(base, "set", i)) for i in range(1, n_sets)]
            del first  # `sets` holds the inputs from here on (placements replace them)
            stage = stages.enter("benchmark first calls")
            judged: list[list] = []
            for i, inputs in enumerate(sets):
                work = _snapshot(inputs) if mutates else inputs
                structure, outs, meta = judge_call(work)
                tensorfile.save(out_dir / f"s{i}_r{rank}.pkbt", outs, structure, meta, key=mac_key)
                judged.append(outs)  # private copies, taken at return
            pristine = [_snapshot(s) for s in sets] if not mutates else None
            # Fresh input sets, interleaved with the replayed ones (docs/measurement.md, "Replay
            # advantage"): fresh_min to fresh_max of them; the outputs of as many as fresh_bytes
            # holds (at least 2, all when they fit, else a subset drawn from the secret seed that
            # the solution cannot tell apart) are judged on the host. Seeds derive from the job's
            # secret seed and the job's label, so no two jobs share them.
            out_bytes = float(sum(t.numel() * t.element_size() for t in judged[0]))
            out_bytes = timing.max_over_ranks([out_bytes], device)[0]
            fresh_cap = int(tcfg.get("fresh_max", 0))
            by_bytes = int(float(tcfg.get("fresh_bytes", 0)) // max(out_bytes, 1.0))
            fresh = None
            fresh_judged: list[int] = []
            if fresh_cap:
                label = str(tcfg.get("fresh_label", ""))
                n_fresh = min(fresh_cap, max(int(tcfg.get("fresh_min", 2)), by_bytes, 2))
                pick = random.Random(derive_seed(base, "fresh judged", label))
                # the first placement always times this many (harness.timing: the budget waits for them)
                sure = max(int(tcfg.get("fresh_min", 2)) // max(1, int(tcfg.get("placements", 1))), 2)
                fresh_judged = judged_fresh_calls(n_fresh, sure, max(2, by_bytes), pick)

                def make_fresh(k: Any) -> tuple:
                    return make(derive_seed(base, "fresh", label, k))

                def save_fresh(k: int, outs: list, structure: str, meta: dict) -> None:
                    tensorfile.save(out_dir / f"f{k}_r{rank}.pkbt", outs, structure, meta, key=mac_key)

                fresh = fresh_calls(
                    make_fresh, solution, mutates, save_fresh, n_fresh, set(fresh_judged), aliasing
                )
            rotate = _input_rotation(sets)
            holds = list(range(n_sets))

            def rotate_sets() -> list[int]:
                assert rotate is not None
                holds[:] = rotate()
                return list(holds)

            working: dict[int, tuple] = {}

            def prepare(i: int) -> None:
                # in-place workloads are timed on fresh copies, made outside the timed region
                working[i] = _snapshot(sets[i]) if mutates else sets[i]

            def call_on_set(i: int):
                timed_set[0] = i
                return solution(*working[i])

            timed_set: list[int] = [0]

            def normalize(out: Any) -> list:
                # compared with the judged outputs of the set just called: its in-place results too
                return in_place(normalize_output(out)[1], working[timed_set[0]])

            stage = stages.enter("benchmark timing")

            placements = max(1, int(tcfg.get("placements", 1)))
            round_cfg = timing.placement_config(tcfg, placements)

            def timed_round() -> dict[str, Any]:
                return timing.run_timing(
                    prepare,
                    call_on_set,
                    normalize,
                    judged,
                    device,
                    round_cfg,
                    cfg["tolerance"],
                    rotate=rotate_sets if rotate is not None else None,
                    after_call=lambda: watch.check("while being timed"),
                    fresh=fresh,
                )

            # Placements after the first find the inputs, the solution's own buffers and the
            # allocator's free blocks at other device addresses: a process's times depend on where
            # its memory landed (docs/plan-fidelity.md), and several placements average that out.
            # The moved inputs keep their data, so their judged outputs still apply.
            # `move_memory: false` keeps the memory where it is (the noise study's baseline).
            records = [timed_round()]
            spacers: list = []
            while len(records) < placements and records[-1]["stop_reason"] != "outputs changed while timing":
                if device.type == "cuda":
                    torch.cuda.synchronize()
                time.sleep(float(tcfg.get("round_gap_ms", 0.0)) / 1e3)
                if tcfg.get("move_memory", True):
                    while rotate is not None and holds != list(range(n_sets)):
                        rotate_sets()  # each set's data back in its own buffers
                    working.clear()
                    spacers.append(
                        torch.empty(random.randrange(1, 64) << 20, dtype=torch.uint8, device=device)
                    )
                    sets = [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in s) for s in sets]
                    if device.type == "cuda":
                        torch.cuda.empty_cache()  # old buffers go back to the driver, not to the next round
                    rotate = _input_rotation(sets)
                if tcfg.get("new_comm"):
                    # a study of where the spread comes from (docs/scripts/noise.py): the next
                    # round gets a new communicator, with new buffers and proxy threads
                    dist.destroy_process_group()
                    round_store = dist.PrefixStore(f"round{len(records)}", store)
                    dist.init_process_group(
                        backend, store=round_store, rank=rank, world_size=world_size, **init_kwargs
                    )
                dist.barrier()
                records.append(timed_round())
            record = timing.pool_placements(records)
            del spacers, records
            if fresh is not None:
                record["fresh_timed"] = fresh.next
                record["fresh_judged"] = fresh_judged
                if tcfg.get("fresh_top_up"):
                    # the reference's job: outputs for every judged fresh seed a candidate's job can reach
                    for k in (k for k in fresh_judged if k >= fresh.next):
                        fresh.prepare(k)
                        fresh.record(k, fresh.call())
                        watch.check("during a call")
            if pristine is not None:
                changed = [i for i, s in enumerate(sets) if mutated_inputs(list(s), list(pristine[holds[i]]))]
                record["inputs_mutated_while_timing"] = bool(
                    timing.max_over_ranks([1.0 if changed else 0.0], device)[0]
                )
            record["per_set_bytes"] = nbytes
        stage = stages.enter("teardown")
        dist.barrier()
        dist.destroy_process_group()
        # Last writes: after every process the solution forked is gone, and followed at once by the
        # exit that ends its threads; the timing record carries the keyed digest the host checks.
        _reap_descendants()
        if record is not None and rank == 0:
            tmp = job_dir / "timing.part"
            tmp.write_text(json.dumps(tensorfile.mac_record(mac_key, record)))
            os.replace(tmp, job_dir / "timing.json")
        status = {"state": "ok", "elapsed_s": time.monotonic() - t_start, "cpus": cpus}
        _write_status(job_dir, rank, {**status, "stages": stages.durations()})
        _exit_now(0)
    except BaseException as exc:  # report every failure of this rank, then exit non-zero
        _write_status(
            job_dir,
            rank,
            {
                "state": "error",
                "stage": stage,
                "error": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": _trimmed_traceback(exc),
                "elapsed_s": time.monotonic() - t_start,
                "cpus": cpus,
                "stages": stages.durations(),
            },
        )
        sys.stderr.write(_trimmed_traceback(exc))
        sys.stderr.flush()
        _reap_descendants()
        os._exit(3)


def main() -> None:
    # the launcher sends SIGUSR1 before killing a stuck rank: its stacks land in the rank's log
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    setup = read_line(sys.stdin)
    if setup is None:
        sys.exit("harness.worker: no set-up line on stdin")
    run(setup, lambda: read_line(sys.stdin))


if __name__ == "__main__":
    main()
