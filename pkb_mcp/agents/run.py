"""`pkb agents run`: an agent's attempts at problems, then their files judged and tabled.

`run_agents` is the Python entry point (`from pkb_mcp.agents.run import run_agents`). Its folder:

    OUT/config.json                    the run's settings (a resumed run must have the same)
    OUT/NNN_slug/attempt-K/            one attempt (pkb_mcp/agents/attempt.py): workspace/, home/,
                                       state/, transcript.jsonl, solution.py, snapshots/,
                                       attempt.json (pkb's record), result.json (Harbor's subset)
    OUT/judged/attempt-K/NNN_slug.py   the collected files, attempt set K for `pkb eval --attempts`
    OUT/report/                        pkb eval's report (the published table, best of k)
    OUT/result.json, OUT/agents.md     the run's scores: pass@k, fast_1@k, causes, cost, steps

An attempt with a complete `attempt.json` is not run again; one without it (interrupted) is, its
folder kept aside. Every collected file goes through `evaluation.batch.evaluate`, so verdicts and
speedups are the ones `pkb eval` gives; pkb_mcp/agents/scores.py makes the run's scores of them.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pkb_mcp import problems, service
from pkb_mcp.agents import attempt as attempts
from pkb_mcp.agents import clients
from pkb_mcp.agents.records import AgentSettings, AttemptRecord, RunResult
from pkb_mcp.errors import UserError
from pkb_mcp.evaluation.records import FileResult
from pkb_mcp.models import RunRequest

Say = Callable[[str], None]


def select_problems(spec: str, variant: str = "pkb") -> list[int]:
    """`--problems`: ids (`3`), ranges (`1-10`), categories (`moe`), names, or `all`, comma-separated."""
    suite = problems.suite(variant)
    chosen: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == "all":
            found = sorted(suite)
        elif part.replace("-", "").isdigit() and "-" in part.strip("-"):
            lo, hi = (int(x) for x in part.split("-", 1))
            found = [i for i in sorted(suite) if lo <= i <= hi]
        elif part.isdigit():
            found = [int(part)] if int(part) in suite else []
        else:
            found = [
                i for i, p in sorted(suite.items()) if part.lower() in (p.category.lower(), p.name.lower())
            ]
        if not found:
            raise UserError(f"--problems {part!r} names no problem (ids, ranges like 1-10, categories, all)")
        chosen += [i for i in found if i not in chosen]
    if not chosen:
        raise UserError("--problems is empty; give ids, ranges, categories or all")
    return chosen


def _check(settings: AgentSettings) -> None:
    """Bad arguments: one sentence before anything starts."""
    if settings.attempts < 1:
        raise UserError(f"--attempts must be at least 1, not {settings.attempts}")
    if settings.wall_s <= 0:
        raise UserError("--wall must be a positive number of seconds")
    if settings.concurrency < 1:
        raise UserError(f"--concurrency must be at least 1, not {settings.concurrency}")
    if settings.max_turns is not None and settings.max_turns < 1:
        raise UserError("--max-turns must be at least 1")
    if settings.max_usd is not None and settings.max_usd <= 0:
        raise UserError("--max-usd must be positive")
    RunRequest.of(path="", device=settings.device, world_size=settings.world_size, variant=settings.variant)
    for pid in settings.problems:
        service.show_problem(pid, settings.world_size, settings.size, settings.variant)  # its world size
    if settings.agent_sandbox == "docker":
        from pkb_mcp.agents import container

        if not container.available():
            raise UserError(
                "no Docker engine answers, and the agent's client runs in a container of its own by default; "
                "start Docker, or pass --agent-sandbox none to run it as you (no isolation)"
            )
        container.prepare()
        if settings.tools == "cli":
            raise UserError(
                "--tools cli runs pkb's command in the agent's own shell, which a container does not have "
                "yet; pass --agent-sandbox none with it"
            )


def _settings_file(out: Path, settings: AgentSettings) -> None:
    """config.json: written once; a resume with other settings is refused (its records would mix)."""
    path = out / "config.json"
    if path.exists():
        try:
            before = AgentSettings.model_validate_json(path.read_text())
        except ValueError as exc:
            raise UserError(f"{path} is not a run's config.json; use another --out") from exc
        mine = settings.model_dump(exclude={"concurrency", "wall_s", "problems", "attempts"})
        theirs = before.model_dump(exclude={"concurrency", "wall_s", "problems", "attempts"})
        changed = sorted(k for k in mine if mine[k] != theirs.get(k))
        if changed:
            raise UserError(
                f"{out} holds a run with other settings ({', '.join(changed)}); use another --out to "
                "start a new run, or the same settings to resume it"
            )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(settings.model_dump_json(indent=2))


def run_agents(
    settings: AgentSettings,
    out: Path,
    *,
    judge: bool = True,
    pass_env: tuple[str, ...] = (),
    say: Say = lambda _: None,
) -> RunResult:
    """Run every attempt not yet complete, then judge and score them all."""
    from pkb_mcp.agents import scores

    client = clients.client(settings.agent)
    exe = clients.executable(client)
    _check(settings)
    unsigned = client.signed_in()
    if unsigned:
        say(f"warning: {unsigned}")
    out = out.expanduser().resolve()
    _settings_file(out, settings)
    started = attempts.now_iso()
    t0 = time.monotonic()
    version = attempts.executable_version(exe) if client.name != "cmd" else None
    suite = problems.suite(settings.variant)
    todo: list[attempts.AttemptSpec] = []
    done: list[AttemptRecord] = []
    for pid in settings.problems:
        slug = suite[pid].path.stem
        for k in range(settings.attempts):
            folder = out / slug / f"attempt-{k}"
            record = attempts.read_record(folder)
            if record is not None:
                done.append(record)
                continue
            todo.append(
                attempts.AttemptSpec(
                    pid, suite[pid].name, k, settings, client, exe, folder, version, pass_env
                )
            )
    resumed = len(done)
    say(f"{len(todo)} attempt(s) to run, {resumed} complete already")
    lock = threading.Lock()

    def one(spec: attempts.AttemptSpec) -> AttemptRecord:
        record = attempts.run_attempt(spec)
        with lock:
            done.append(record)
            say(
                f"[{len(done) - resumed}/{len(todo)}] problem {spec.problem_id} attempt {spec.attempt}: "
                f"{record.status} in {record.wall_s:.0f} s, {record.usage.tool_calls} tool calls"
            )
        return record

    with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        list(pool.map(one, todo))
    results = _judge(settings, out, done, say) if judge else {}
    records = sorted(done, key=lambda r: (r.problem_id, r.attempt))
    categories = {pid: suite[pid].category for pid in settings.problems}
    scored = scores.score(records, results, categories)
    for record in records:
        _harbor_result(
            out / suite[record.problem_id].path.stem / f"attempt-{record.attempt}", record, results
        )
    run = RunResult(
        settings=settings,
        started_at=started,
        finished_at=attempts.now_iso(),
        attempts_run=len(todo),
        attempts_resumed=resumed,
        scores=scored,
        pass_at_k=scored.pass_at_k,
    )
    run.reports = _write_reports(out, run, scores)
    (out / "result.json").write_text(run.model_dump_json(indent=2))
    say(f"done in {time.monotonic() - t0:.0f} s: {out / 'result.json'}")
    return run


def _judge(
    settings: AgentSettings, out: Path, records: list[AttemptRecord], say: Say
) -> dict[tuple[int, int], FileResult]:
    """Every collected file through pkb eval, attempt K being attempt set K."""
    from pkb_mcp.evaluation.batch import evaluate

    suite = problems.suite(settings.variant)
    judged = out / "judged"
    shutil.rmtree(judged, ignore_errors=True)
    sets: dict[Path, tuple[int, int]] = {}
    for r in records:
        if r.solution is None:
            continue
        slug = suite[r.problem_id].path.stem
        src = out / slug / f"attempt-{r.attempt}" / r.solution
        dest = judged / f"attempt-{r.attempt}" / f"{slug}.py"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        sets[dest.resolve()] = (r.problem_id, r.attempt)
    if not sets:
        return {}
    paths = sorted({str(p.parent) for p in sets})
    say(f"judging {len(sets)} file(s) with pkb eval")
    report = evaluate(
        paths,
        world_size=settings.world_size,
        device=settings.device,
        size=settings.size,
        variant=settings.variant,
        attempts=True,
        store=out / "eval.sqlite",
        out_dir=out / "report",
        progress=lambda done, total, file, what: say(f"  eval {done}/{total} {Path(file).name}: {what}"),
    )
    found: dict[tuple[int, int], FileResult] = {}
    for result in report.results:
        key = sets.get(Path(result.file).resolve())
        if key is not None:
            found[key] = result
    return found


def _harbor_result(folder: Path, r: AttemptRecord, results: dict[tuple[int, int], FileResult]) -> None:
    """result.json: the attempt as a subset of Harbor's trial result (docs/agents.md, "One attempt")."""
    judged = results.get((r.problem_id, r.attempt))
    rewards: dict[str, Any] | None = None
    if judged is not None:
        rewards = {"reward": 1.0 if judged.correct else 0.0}
    exception = None
    if r.status != "done":
        exception = {
            "exception_type": r.status,
            "exception_message": r.message,
            "exception_traceback": "",
            "occurred_at": r.finished_at,
        }
    data = {
        "task_name": folder.parent.name,
        "trial_name": f"{folder.parent.name}__{folder.name}",
        "agent_info": {
            "name": r.agent,
            "version": r.agent_version or "unknown",
            "model_info": {"name": r.model} if r.model else None,
        },
        "agent_result": {
            "n_input_tokens": r.usage.input_tokens,
            "n_cache_tokens": r.usage.cached_tokens,
            "n_output_tokens": r.usage.output_tokens,
            "cost_usd": r.usage.cost_usd,
        },
        "verifier_result": {"rewards": rewards} if rewards is not None else None,
        "exception_info": exception,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        # one reward key only: Harbor computes pass@k only then; the speedup goes beside it
        "pkb": {
            "status": r.status,
            "agent_sandbox": r.agent_sandbox,
            "tools": r.tools,
            "speedup": judged.speedup if judged is not None and judged.credited else None,
        },
    }
    (folder / "result.json").write_text(json.dumps(data, indent=2))


def _write_reports(out: Path, run: RunResult, scores: Any) -> dict[str, str]:
    lines = [f"# Agent run: {run.settings.agent} ({run.settings.model or 'default model'})", ""]
    lines += [
        f"agent sandbox: {run.settings.agent_sandbox}; tools: {run.settings.tools}; "
        f"{len(run.settings.problems)} problem(s) x {run.settings.attempts} attempt(s)",
        "",
    ]
    lines += scores.to_markdown(run.scores)
    (out / "agents.md").write_text("\n".join(lines) + "\n")
    written = {"md": str(out / "agents.md")}
    png = out / "steps.png"
    if run.scores.steps and scores.write_steps_png(run.scores.steps, png) is None:
        written["steps_png"] = str(png)
    report = out / "report" / "report.md"
    if report.exists():
        written["eval"] = str(report)
    return written
