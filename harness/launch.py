"""Rank launcher: starts one worker process per rank and reports each rank's outcome (stdlib only).

Run as `python -m harness.launch` inside the sandbox with the launch configuration (a LaunchConfig, or a
ToolConfig: harness/contracts.py) as JSON on stdin (or in a file named by `--config-file`, deleted as
soon as it is read); one that does not match its contract ends the launcher with one sentence saying why.
In the process backend the launcher is instead a fork of the fork server (harness/forkserver.py), and
its workers are forks of it rather than new interpreters.
Each worker gets its set-up (a RankSetup) and then its launch (a RankConfig, with its rank and the trial
seeds) through its stdin pipe, so seeds never touch the launch directory.

Warm start: `--warm SETUP --config-file PATH` starts the workers at once from SETUP (a WarmSetup: world
size, device, nothing secret), lets them import torch and create the process group, and only then waits
for PATH to appear (the launch, written by the host when one is dispatched to this sandbox). A warm
sandbox serves exactly one launch; if none arrives within SETUP's `idle_s` it exits and writes nothing.
Of world size 0 it is a tool sandbox: no workers; the launcher imports torch and the build program,
then runs the tool launch that arrives.
A gated one (SETUP's `gated`) lets its workers go only as far as needs no GPU (torch imported, each
writes rank{rank}.staged); they get a go line once the host writes GO_NAME beside PATH, or with the
launch.
A profile's counter launch (its configuration carries a CounterPlan) never runs warm: each rank
starts as a new interpreter under its own Nsight Compute (harness/counters.py).

Forked ranks: `--ranks SETUP --config-file PATH` (SETUP a WorkerSetup, nothing secret; the Docker
backend's launches that start with their sandbox) imports torch and the worker once, forks each rank
from itself (harness/forking.py, as the process backend's fork server does), and only then reads PATH:
no rank's memory holds the launch's seeds or its end token. A launch of several ranks so pays one
torch import, not one a rank (docs/sandbox.md, "A check's start-up").

The launcher watches the workers: when one fails, the others get a short grace period to finish
(they are usually stuck in a collective) and are then killed; at the deadline everything left is
killed. It writes launch.json, a LaunchRecord: each rank's RankRecord, the worker's own status file
completed with what the launcher saw (exit status, signal), the wall time and whether the deadline
passed. A tool launch writes a ToolRecord instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from harness import counters, forking
from harness.contracts import (
    GO_LINE,
    GO_NAME,
    STARTING,
    ContractError,
    CounterPlan,
    LaunchConfig,
    LaunchRecord,
    RankConfig,
    RankRecord,
    RankSetup,
    ToolConfig,
    ToolRecord,
    WorkerSetup,
    read_launch_config,
    read_rank_status,
    read_tool_config,
    read_warm_setup,
    read_worker_setup,
)
from harness.forking import ForkedWorker

PEER_GRACE_S = 5.0
POLL_S = 0.02
STACK_DUMP_WAIT_S = 0.3
LOG_HEAD = 16 << 20  # bytes of a rank's output written to its log as they come
LOG_TAIL = 1 << 20  # and of the rest, the last ones, written at its end after a line saying what was cut
LOG_DRAIN_S = 2.0  # how long the record waits for a rank's log to be written out once it has ended


class RankLog(threading.Thread):
    """A rank's stdout and stderr, capped where they are written: the rank writes into a pipe, and
    this thread of the launcher copies the first LOG_HEAD bytes into rank{rank}.log, keeps only the
    last LOG_TAIL of the rest, and appends those at the end with a line saying how much was left
    out. So a rank that prints without end fills neither the disk nor the host's read of its log,
    and its last lines (a traceback, the stacks of a stuck rank) are still there."""

    def __init__(self, path: Path) -> None:
        super().__init__(name=f"pkb-{path.name}", daemon=True)
        self.read_fd, self.write_fd = os.pipe()
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by the thread
        self.start()

    def run(self) -> None:
        written = cut = 0
        rest = bytearray()
        try:
            while chunk := os.read(self.read_fd, 1 << 16):
                head = chunk[: max(0, LOG_HEAD - written)]
                if head:
                    self._file.write(head)
                    written += len(head)
                if len(head) < len(chunk):
                    rest += chunk[len(head) :]
                    cut += len(chunk) - len(head)
                    if len(rest) > 2 * LOG_TAIL:
                        del rest[: len(rest) - LOG_TAIL]
            if cut:
                kept = bytes(rest[-LOG_TAIL:])
                self._file.write(
                    f"\n[pkb: {cut - len(kept)} bytes of this rank's output left out]\n".encode()
                )
                self._file.write(kept)
        except OSError:
            pass  # the disk refused (a limit): what was written stays
        finally:
            os.close(self.read_fd)
            self._file.close()

    def handed_over(self) -> None:
        """The rank has its copy of the pipe's write end: the launcher's goes, so the log ends with the
        rank's output."""
        os.close(self.write_fd)


RANK_LOGS: dict[int, RankLog] = {}  # each rank's log by its rank (a launcher serves one launch)


def _worker_env(rank: int, setup: WorkerSetup) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(setup["world_size"])})
    if setup["device"] == "cpu":
        env["OMP_NUM_THREADS"] = str(setup["threads_per_rank"])
    return env


def _read_status(launch_dir: Path, rank: int) -> RankRecord:
    """The worker's part of the rank's record; {} when it wrote none (or nothing readable)."""
    try:
        data = json.loads((launch_dir / f"rank{rank}.status.json").read_text())
    except (OSError, ValueError):
        return {}
    return read_rank_status(data)


def setup_of(cfg: LaunchConfig) -> WorkerSetup:
    """What a worker needs before its launch: nothing secret."""
    return {
        "launch_dir": cfg["launch_dir"],
        "world_size": cfg["world_size"],
        "device": cfg["device"],
        "threads_per_rank": cfg["threads_per_rank"],
        "rank_cpus": cfg["rank_cpus"],
        "setup_timeout_s": cfg["timeout_s"],
    }


def rank_setup(setup: WorkerSetup, rank: int) -> RankSetup:
    """Rank `rank`'s set-up line: a warm sandbox's own keys (idle_s) stay with the launcher, which
    tells the rank only that it is warm, and whether it waits for a go line before using the GPU."""
    line: RankSetup = {
        "launch_dir": setup["launch_dir"],
        "world_size": setup["world_size"],
        "device": setup["device"],
        "threads_per_rank": setup["threads_per_rank"],
        "rank_cpus": setup["rank_cpus"],
        "setup_timeout_s": setup["setup_timeout_s"],
        "rank": rank,
        "warm": "idle_s" in setup,
    }
    if setup.get("gated"):
        line["gated"] = True
    return line


def _pin(cpus: list[int]) -> Callable[[], None] | None:
    """A child's first act, before it can start a thread: keep to `cpus` (every thread it starts
    inherits them)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


Worker = subprocess.Popen[bytes] | ForkedWorker


def _run_worker() -> None:
    from harness import worker

    worker.main()


def spawn(setup: WorkerSetup, fork: bool = False, plan: CounterPlan | None = None) -> list[Worker]:
    """One worker per rank, each sent its set-up line; their stdin stays open for the launch (and, in
    a gated sandbox, for the go line before it: see wait_for_launch).
    Rank r runs on the CPUs `rank_cpus[r]` when the setup names them (sandbox/cpus.py). With `fork`
    (a launcher forked from the fork server, torch already imported) each rank is a fork of this
    process instead of a new interpreter. With a counter `plan` each rank is a new interpreter started
    under its own Nsight Compute (harness/counters.py), whatever `fork` says."""
    launch_dir = Path(setup["launch_dir"])
    rank_cpus = setup["rank_cpus"]
    forking.become_subreaper()  # orphans of the ranks' processes come here (launch kills them)
    procs: list[Worker] = []
    for rank in range(setup["world_size"]):
        log = RankLog(launch_dir / f"rank{rank}.log")
        proc: Worker
        env = _worker_env(rank, setup)
        wrapper: list[str] = []
        if plan is not None:
            wrapper, extra = counters.ncu_wrapper(plan, rank, launch_dir)
            env.update(extra)
        if fork and plan is None:
            read_end, write_end = os.pipe()
            pid = forking.fork_child(
                _run_worker,
                stdin=read_end,
                log=log.write_fd,
                cwd=str(launch_dir),
                env=env,
                cpus=rank_cpus[rank] if rank_cpus else None,
                close=[
                    write_end,
                    *(p.stdin.fileno() for p in procs if p.stdin is not None),
                    *(RANK_LOGS[r].read_fd for r in range(rank)),  # another rank's output is not its to read
                    log.read_fd,
                ],
            )
            os.close(read_end)
            proc = ForkedWorker(pid, os.fdopen(write_end, "wb"))
        else:
            proc = subprocess.Popen(
                [*wrapper, sys.executable, "-m", "harness.worker"],
                stdin=subprocess.PIPE,
                stdout=log.write_fd,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=launch_dir,
                preexec_fn=_pin(rank_cpus[rank]) if rank_cpus else None,
            )
        log.handed_over()
        RANK_LOGS[rank] = log
        _send(proc, rank_setup(setup, rank), close=False)
        procs.append(proc)
    return procs


def _send(proc: Worker, message: RankSetup | RankConfig | dict[str, bool] | None, close: bool) -> None:
    assert proc.stdin is not None
    try:
        if message is not None:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
        if close:
            proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the worker died already; its outcome is read from its exit status


def wait_for_launch(
    path: Path, idle_s: float, procs: list[Worker], gate: Path | None = None
) -> LaunchConfig | ToolConfig | None:
    """A warm sandbox's launch: the file the host writes into the launch directory; None at idle_s, or as
    soon as a worker has died (a sandbox that cannot serve a launch must not look ready for one).
    With `gate` (a gated sandbox), the ranks get their go line once the host has written that file, or
    just before the launch at the latest."""
    give_up = time.monotonic() + idle_s
    while time.monotonic() < give_up and all(p.poll() is None for p in procs):
        if gate is not None and (gate.exists() or path.exists()):
            for proc in procs:
                _send(proc, GO_LINE, close=False)
            gate = None
        if path.exists():
            return read_config(path)
        time.sleep(0.002)
    return None


def launch(cfg: LaunchConfig, procs: list[Worker] | None = None, fork: bool = False) -> LaunchRecord:
    """Run the launch `cfg` on `procs` (warm workers already set up) or on workers started now
    (forked with `fork`: see spawn)."""
    launch_dir = Path(cfg["launch_dir"])
    world_size = cfg["world_size"]
    deadline = time.monotonic() + cfg["timeout_s"]
    t0 = time.monotonic()
    if procs is None:
        procs = spawn(setup_of(cfg), fork, cfg.get("counters"))
    token = cfg.get("end_token")
    if token is not None:  # the token is this process's alone (docs/sandbox.md, "A launch's end")
        forking.keep_private()
    for rank, proc in enumerate(procs):
        rank_cfg = cast(RankConfig, {k: v for k, v in cfg.items() if k != "end_token"} | {"rank": rank})
        _send(proc, rank_cfg, close=True)

    ended: dict[int, float] = {}
    leaving: set[int] = set()  # ranks whose record is written while the kernel ends their process
    # ranks seen past their start (rank{rank}.ready: the process group joined, a warm sandbox's
    # before its launch came); only ever added to, so no candidate can take a rank's start back
    started: set[int] = set()
    signalled: set[int] = set()  # ranks this launcher sent its signals at the deadline or a failure
    first_failure: float | None = None
    timed_out = False
    while len(ended) < world_size:
        now = time.monotonic()
        for rank, proc in enumerate(procs):
            if rank not in started and (launch_dir / f"rank{rank}.ready").exists():
                started.add(rank)
            if rank in ended:
                continue
            if proc.poll() is not None:
                ended[rank] = now - t0
                finished = proc.returncode == 0 and _read_status(launch_dir, rank).get("state") == "ok"
                if not finished and first_failure is None:
                    first_failure = now
            elif token is not None and _leaving_ok(launch_dir, rank, proc.pid):
                ended[rank] = now - t0
                leaving.add(rank)
        if len(ended) == world_size:
            break
        if now > deadline:
            timed_out = True
        if timed_out or (first_failure is not None and now - first_failure > PEER_GRACE_S):
            # each stuck rank writes its Python stacks to its log (faulthandler), then dies
            for rank, proc in enumerate(procs):
                if rank not in ended:
                    signalled.add(rank)
                    proc.send_signal(signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S)
            for rank, proc in enumerate(procs):
                if rank not in ended:
                    proc.kill()
            for rank, proc in enumerate(procs):
                if rank not in ended:
                    proc.wait()
                    ended[rank] = time.monotonic() - t0
            break
        time.sleep(POLL_S)

    ranks = [
        rank_record(
            rank,
            0 if rank in leaving and proc.poll() is None else proc.returncode,
            ended.get(rank, 0.0),
            _read_status(launch_dir, rank),
            timed_out,
            aborted=first_failure is not None,
            signalled=rank in signalled,
            started=rank in started,
        )
        for rank, proc in enumerate(procs)
    ]
    record: LaunchRecord = {"ranks": ranks, "wall_s": round(time.monotonic() - t0, 3), "timed_out": timed_out}
    # what a rank's processes left came to this process (the subreaper): none may run past the record
    forking.reap_descendants(leaving={procs[r].pid for r in leaving})
    give_up = time.monotonic() + LOG_DRAIN_S
    for rank in range(len(procs)):  # every log written out but those of ranks still leaving
        if rank not in leaving and rank in RANK_LOGS:
            RANK_LOGS[rank].join(max(0.0, give_up - time.monotonic()))
    if token is not None:
        record["end_token"] = token
    return record


def _leaving_ok(launch_dir: Path, rank: int, pid: int) -> bool:
    """Whether a rank that has not exited yet is over, as far as its launch goes: its status says ok
    and nothing of it can run again (forking.gone). The worker exits 0 right after writing that
    status; the kernel's end of its process, which frees its CUDA context and communicators, takes
    0.1-0.3 s more on GPUs, and a check's launch need not wait for it (docs/sandbox.md, "A launch's
    end")."""
    return _read_status(launch_dir, rank).get("state") == "ok" and forking.gone(pid)


def rank_record(
    rank: int,
    rc: int | None,
    ended_s: float,
    status: RankRecord,
    timed_out: bool,
    aborted: bool,
    signalled: bool = False,
    started: bool = True,
) -> RankRecord:
    """A rank's entry of launch.json: its own status (`status`, {} when it wrote none) completed with
    how its process ended (`rc`, killed at the deadline or after a peer failed). `signalled`: the
    launcher sent it SIGUSR1 and SIGKILL, so a death by either is the launcher's deadline or abort,
    not a crash (a rank still starting has no SIGUSR1 handler yet, and SIGUSR1 ends it); `started`:
    it was seen past its start (its process group joined) before it ended."""
    entry: RankRecord = {
        "rank": rank,
        "exit_code": rc,
        "signal": None,
        "elapsed_s": round(ended_s, 3),
        "cpus": status.get("cpus"),
        "stages": status.get("stages"),
        "startup_s": status.get("startup_s"),
    }
    if status.get("state") == "ok" and rc == 0:
        entry["state"] = "ok"
    elif status.get("state") == "error":
        entry["state"] = "error"
        entry["error"] = str(status.get("error"))
        entry["stage"] = str(status.get("stage"))
        entry["traceback"] = str(status.get("traceback") or "")
    elif signalled and rc in (-signal.SIGUSR1, -signal.SIGKILL):
        entry["state"] = "timeout" if timed_out else "aborted"
        entry["signal"] = signal.Signals(-rc).name
        if timed_out and not started:
            entry["stage"] = STARTING  # the deadline came before its launch could begin
    elif rc is not None and rc < 0 and rc != -signal.SIGKILL:
        entry["state"], entry["signal"] = "crashed", signal.Signals(-rc).name
    elif rc == -signal.SIGKILL:
        entry["state"] = "timeout" if timed_out else ("aborted" if aborted else "crashed")
        entry["signal"] = "SIGKILL"
    elif rc == 0:
        entry["state"] = "exited"  # returned without finishing the launch
    else:
        entry["state"], entry["error"] = "crashed", f"exit status {rc}"
    return entry


TOOL_MODES = ("discover", "build")


def run_tool(cfg: ToolConfig) -> ToolRecord:
    """A launch that runs one program instead of ranks: `discover` imports the candidate in a child
    process (harness/discover.py) to find its extension builds; `build` runs compilers and extension
    builds that the host planned (harness/build.py), with no candidate code."""
    launch_dir = Path(cfg["launch_dir"])
    t0 = time.monotonic()
    timeout_s = cfg["timeout_s"]
    if cfg["mode"] == "discover":
        out = launch_dir / "discovered.json"
        argv = [sys.executable, "-I", "-B", str(Path(__file__).with_name("discover.py"))]
        proc = subprocess.Popen(
            [*argv, cfg.get("solution_path", ""), str(out)],
            stdin=subprocess.DEVNULL,
            stdout=open(launch_dir / "discover.log", "wb"),  # noqa: SIM115 - handed to the child
            stderr=subprocess.STDOUT,
            cwd=launch_dir,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return {"tool": "discover", "exit_code": code, "wall_s": round(time.monotonic() - t0, 3)}
    from harness import build

    result = build.main(cfg)
    part = launch_dir / "build.json.part"
    part.write_text(json.dumps(result))
    os.replace(part, launch_dir / "build.json")
    return {"tool": "build", "exit_code": 0, "wall_s": round(time.monotonic() - t0, 3)}


def _warm_tool(config_file: Path, idle_s: float) -> tuple[str | None, ToolRecord | None]:
    """A warm tool sandbox (world size 0): torch and the build program imported ahead (3-3.5 s of
    a build launch on a GPU node, 2026-11-27), then the tool launch the host writes, run."""
    import torch.utils.cpp_extension  # noqa: F401 - what every build needs first

    from harness import build  # noqa: F401

    cfg = wait_for_launch(config_file, idle_s, [])
    if cfg is None:
        return None, None
    if cfg["mode"] not in TOOL_MODES:
        sys.exit("harness.launch: a launch of ranks does not fit a warm tool sandbox")
    tool_cfg = cast(ToolConfig, cfg)
    return tool_cfg["launch_dir"], run_tool(tool_cfg)


def _json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ContractError(f"{what} is not JSON ({exc})") from None


def read_config(path: Path) -> LaunchConfig | ToolConfig:
    """The launch configuration from a file, deleted once read: no candidate code exists yet, and none
    may ever read the seeds in it."""
    text = path.read_text()
    path.unlink()
    data = _json(text, "the launch configuration")
    if isinstance(data, dict) and data.get("mode") in TOOL_MODES:
        return read_tool_config(data)
    return read_launch_config(data)


def main(argv: list[str], fork_workers: bool = False) -> None:
    """`fork_workers`: this launcher is a fork of the fork server (harness/forkserver.py), so its
    ranks are forks of it too."""
    try:
        launch_dir, result = _run(dict(zip(argv[::2], argv[1::2], strict=False)), fork_workers)
    except ContractError as exc:
        sys.exit(f"harness.launch: {exc}")
    if launch_dir is None:
        return
    path = Path(launch_dir) / "launch.json"
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)
    forking.reap_descendants()  # ranks whose exit the record did not wait for


def _run(args: dict[str, str], fork: bool = False) -> tuple[str | None, LaunchRecord | ToolRecord | None]:
    """The launch the arguments name, run: its directory and record; (None, None) for a warm sandbox
    that was never used."""
    if "--warm" in args:
        setup = read_warm_setup(_json(args["--warm"], "the warm set-up"))
        config_file = Path(args["--config-file"])
        if setup["world_size"] == 0:  # a tool sandbox: no ranks
            return _warm_tool(config_file, setup["idle_s"])
        procs = spawn(setup, fork)
        gate = config_file.parent / GO_NAME if setup.get("gated") else None
        warm_cfg = wait_for_launch(config_file, setup["idle_s"], procs, gate)
        if warm_cfg is None:
            for proc in procs:
                _send(proc, None, close=True)  # an empty line: the worker leaves quietly
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            return None, None
        if warm_cfg["mode"] in TOOL_MODES:
            sys.exit("harness.launch: a tool launch does not fit a warm sandbox of ranks")
        rank_cfg = cast(LaunchConfig, warm_cfg)
        mismatch = rank_cfg["world_size"] != len(procs) or rank_cfg["device"] != setup["device"]
        if mismatch or "counters" in rank_cfg:  # a counter launch's ranks start under ncu: never warm
            sys.exit("harness.launch: the launch does not fit this warm sandbox")
        return rank_cfg["launch_dir"], launch(rank_cfg, procs)
    if "--ranks" in args:
        return _forked_ranks(read_worker_setup(_json(args["--ranks"], "the ranks' set-up")), args)
    if "--config-file" in args:
        cfg = read_config(Path(args["--config-file"]))
        if cfg["mode"] in TOOL_MODES:
            return cfg["launch_dir"], run_tool(cast(ToolConfig, cfg))
        return cfg["launch_dir"], launch(cast(LaunchConfig, cfg), fork=fork)
    stdin_cfg = read_launch_config(_json(sys.stdin.read(), "the launch configuration"))
    return stdin_cfg["launch_dir"], launch(stdin_cfg)


def _forked_ranks(setup: WorkerSetup, args: dict[str, str]) -> tuple[str | None, LaunchRecord | None]:
    """`--ranks`: the ranks forked from this launcher once it has imported torch, before it reads the
    launch (module docstring); then the launch run on them."""
    from harness import worker  # noqa: F401 - torch and the rank's program, imported once for every rank

    procs = spawn(setup, fork=True)
    cfg = read_config(Path(args["--config-file"]))
    fits = cfg["mode"] not in TOOL_MODES and "counters" not in cfg
    rank_cfg = cast(LaunchConfig, cfg)
    if not fits or rank_cfg["world_size"] != len(procs) or rank_cfg["device"] != setup["device"]:
        for proc in procs:
            _send(proc, None, close=True)  # an empty line: the worker leaves quietly
        sys.exit("harness.launch: the launch does not fit the ranks forked for it")
    return rank_cfg["launch_dir"], launch(rank_cfg, procs)


if __name__ == "__main__":
    main(sys.argv[1:])
