"""The MCP server: each tool is a few lines over the service layer and the scheduler.

Tools return `structuredContent` (the service's model, compacted) and the same facts as text in
`content`. Errors an agent can act on are ToolErrors with one sentence. Long tools run as jobs:
`wait=true` awaits the job and forwards progress; `wait=false` returns its id for job_status,
job_result and cancel_job. Nothing is ever written to stdout but the protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    InputRequiredResult,
    ReadResourceRequestParams,
    ReadResourceResult,
    TextContent,
)
from mcp_types import Tool as PublishedTool
from pydantic import BaseModel, Field, ValidationError, WithJsonSchema, create_model

from pkb_mcp import config, models, render, service
from pkb_mcp.agents import trail
from pkb_mcp.agents.task import attempt_text
from pkb_mcp.errors import ECHO_CHARS, UserError, echoed
from pkb_mcp.frontends.schemas import published_input, published_output
from pkb_mcp.frontends.surface import CACHE_HINTS, CANCELS, READ_ONLY, RUNS_CODE, TOOL_ORDER, ordered
from pkb_mcp.jobs.scheduler import Scheduler
from pkb_mcp.jobs.store import JobRecord
from pkb_mcp.models import (
    BenchResult,
    CheckResult,
    ProblemDetail,
    ProblemPage,
    Result,
    RooflineResult,
    RunRequest,
    lean_property,
)
from pkb_mcp.profiling.profile import ProfileResult, profiles_root
from pkb_mcp.runs import pairing, run
from pkb_mcp.service import VERBS

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

MAX_SOURCE_BYTES = 1 << 20
TRACEBACK_CHARS = 1500
LOG_CHARS = 600
DETAILED_FAILURES = 2  # ranks whose traceback and log stay in the compact result
POLL_S = 0.1

# The first sentence is what a client that defers the tools' schemas shows a model before any tool
INSTRUCTIONS = """\
pkb judges multi-GPU kernel solutions: replace a problem's PyTorch + NCCL reference with a faster
solution(...) and get a per-rank correctness verdict, a speedup credited only beyond run-to-run noise,
and % of the roofline floor, all run in a sandbox. Work in this order: list_problems, get_reference (or
the attempt_problem prompt), write a Python file defining solution(...) with the reference's
signature, run_correctness until it passes, then benchmark; profile and roofline show where the time
goes. Long calls accept wait=false and return a job id (job_status, job_result, cancel_job).
NVLink multicast (multimem / NVLS) is unavailable and must not be used."""


class _Server(MCPServer):
    """Publishes its tools in our order (frontends/surface.py), with portable, short schemas
    (frontends/schemas.py) and descriptions without the docstrings' indentation; answers a refused
    call in one sentence, with the sentence as structured content too; repeats at most ECHO_CHARS of
    a resource's URI in an error. `verb_tool` registers the tool of a verb (VERBS)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.verb_tools: list[str] = []  # the kinds whose tools are registered

    def verb_tool(self, kind: str) -> Any:
        """The decorator of the tool that submits a verb's jobs: its name from the verb's row."""
        self.verb_tools.append(kind)
        return self.tool(name=VERBS[kind].tool, annotations=RUNS_CODE)

    async def _handle_read_resource(
        self, ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult | InputRequiredResult:
        # the SDK's own errors ("Unknown resource: ...", and their data) repeat the whole URI
        try:
            return await super()._handle_read_resource(ctx, params)
        except MCPError as exc:
            uri = str(params.uri)
            said, data = shortened(exc.message, uri), {"uri": echoed(uri)} if exc.data is not None else None
            raise MCPError(code=exc.code, message=said, data=data) from exc

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError):
                raise
            text = refusal_sentence(name, exc)
            content = [TextContent(type="text", text=text)]
            return CallToolResult(content=content, structured_content={"error": text}, is_error=True)

    async def list_tools(self) -> list[PublishedTool]:
        published = [
            t.model_copy(
                update={
                    "input_schema": published_input(t.input_schema),
                    "output_schema": published_output(t.output_schema) if t.output_schema else None,
                    "description": " ".join(t.description.split()) if t.description else t.description,
                }
            )
            for t in ordered(await super().list_tools())
        ]
        trail.mark_listed([t.name for t in published])  # an agent run's preflight (agents/trail.py)
        return published


def refusal_sentence(tool: str, exc: ToolError) -> str:
    """A refused call's reason in one sentence: an argument that failed validation by its name (the
    first, when several did), else the tool's own sentence without the SDK's prefix."""
    cause = exc.__cause__
    if isinstance(cause, ValidationError) and cause.errors():
        first = cause.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the arguments"
        more = len(cause.errors()) - 1
        given = repr(first.get("input"))
        given = given if len(given) <= 40 else given[:37] + "..."
        said = f"{first['msg'][:1].lower()}{first['msg'][1:]}, not {given}"
        return f"{tool}: argument {where}: {said}" + (f" (and {more} more)" if more else "")
    return in_tool_words(str(exc).removeprefix(f"Error executing tool {tool}: "))


def Arg(**kwargs: Any) -> Any:
    """A tool parameter's Field, its schema lean like the results' (models.lean_property)."""
    return Field(json_schema_extra=lean_property, **kwargs)


# published as a string (frontends/schemas.py): an integer id is still accepted
ProblemRef = Annotated[int | str, Arg(description="id or name, e.g. '12' or 'allgather_gemm'")]
# every problem of the suite needs 2 ranks or more (each its own rule, which a request meets too)
WorldSize = Annotated[models.WorldSize, Arg(ge=2, description="ranks (one GPU each on cuda)")]
SizePreset = Annotated[str, Arg(description="'pkb' (the original's) or 'large'")]
Variant = Annotated[
    models.VariantName,
    Arg(description="original: the original benchmark's exact workload"),
]
Source = Annotated[str | None, Arg(description="the code; or give path")]
SourcePath = Annotated[str | None, Arg(description="a file under the server's roots; or give source")]
Device = Annotated[models.DeviceName | None, Arg(description="default: cuda when the node has GPUs")]
Timeout = Annotated[models.TimeoutS, Arg(description="limit for each sandboxed run")]
Wait = Annotated[bool, Arg(description="false: return a job id at once")]
Convention = Annotated[
    models.ConventionName,
    Arg(description="solution()'s calling convention (auto: by its signature)"),
]


PROFILE_RESULT = {
    "anyOf": [{"type": "object", "additionalProperties": True}, {"type": "null"}],
    "description": "per side and rank: communication, compute, overlap, gaps; docs/measurement.md",
}


class JobOutput(Result):
    """What a long tool returns: the job, and its result once it has one."""

    job_id: str
    state: str = Field(description="queued, running, done, failed or cancelled")
    message: str = ""
    error: str | None = None  # why the job failed or was cancelled
    result_uri: str = Field(description="the full result: every rank, each side's timing, static report")


class AnyJobOutput(JobOutput):
    kind: str = Field(description="compile, check, bench or profile")
    result: dict[str, Any] | None = Field(None, description="the result as the tool of its kind returns it")


# A result's type as a tool's output schema publishes it: its model, but for the profile's, whose fields
# are left out of tools/list (their size; docs/measurement.md defines them).
PUBLISHED_RESULT: dict[str, Any] = {"profile": Annotated[Any, WithJsonSchema(PROFILE_RESULT)]}
OUTPUTS: dict[str, type[JobOutput]] = {  # a verb's tool's output model, by Kind (VERBS)
    kind: create_model(
        f"{kind.title()}Output",
        __base__=JobOutput,
        result=(PUBLISHED_RESULT.get(kind, verb.result | None), None),
    )
    for kind, verb in VERBS.items()
}
for _verb in VERBS.values():  # at import: each verb's tool has its place in tools/list
    if _verb.tool not in TOOL_ORDER:
        raise RuntimeError(f"the tool {_verb.tool} of a verb is not in surface.TOOL_ORDER")


@contextlib.contextmanager
def tool_errors(*given: str) -> Iterator[None]:
    """A user error becomes a ToolError whose one sentence the model reads, its hints in this front
    end's words, and the client's values in `given` (ids, names) repeated at most ECHO_CHARS long."""
    try:
        yield
    except UserError as exc:
        raise ToolError(shortened(in_tool_words(str(exc)), *given)) from exc


def shortened(message: str, *given: str) -> str:
    """A message with each of the client's values in it (as given, stripped, or quoted) cut by echoed."""
    for value in given:
        for form in {value, value.strip(), repr(value), repr(value.strip())}:
            if len(form) > ECHO_CHARS:
                message = message.replace(form, echoed(form))
    return message


# the service layer's hints name the CLI (its first front end); an agent reads the tools' names
_CLI_HINTS = (
    (re.compile(r"\bsee pkb problems\b"), "see list_problems"),
    (re.compile(r"\bpkb show ID\b"), "get_reference"),
    (re.compile(r"\bpass --([a-z][a-z-]*) (\S+)"), lambda m: f"pass {_argument(m[1])}={m[2]}"),
)
_ARGUMENTS = {"timeout": "timeout_s"}  # a CLI flag whose tool argument is not its name in snake case


def _argument(flag: str) -> str:
    """The tool argument a CLI flag (without its dashes) sets."""
    return _ARGUMENTS.get(flag, flag.replace("-", "_"))


def in_tool_words(text: str) -> str:
    """A message whose hints name CLI commands and flags, naming the MCP tools and arguments instead."""
    for pattern, words in _CLI_HINTS:
        text = pattern.sub(words, text)  # type: ignore[arg-type]
    return text


def reply(model: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=model.model_dump(mode="json")
    )


def compact(result: BaseModel) -> BaseModel:
    """Trim tracebacks and logs to the first failing ranks so results stay small for every client."""
    if not isinstance(result, (CheckResult, BenchResult, ProfileResult)):
        return result
    copy = result.model_copy(deep=True)
    detailed = 0
    for rank in copy.ranks:
        if rank.state == "pass" or detailed >= DETAILED_FAILURES:
            rank.traceback = rank.log_tail = None
            continue
        detailed += 1
        if rank.traceback:
            rank.traceback = rank.traceback[-TRACEBACK_CHARS:]
        if rank.log_tail:
            rank.log_tail = rank.log_tail[-LOG_CHARS:]
    return copy


class ServerState:
    """The server's state: the scheduler, where submitted sources are kept, and the folders a `path`
    argument may name (`roots`, default config.mcp_roots(); the state folder, which holds
    `sources_dir`, is always one)."""

    def __init__(self, scheduler: Scheduler, sources_dir: Path, roots: Sequence[Path] | None = None):
        self.scheduler = scheduler
        self.sources_dir = sources_dir
        sources_dir.mkdir(parents=True, exist_ok=True)
        given = config.mcp_roots() if roots is None else roots
        self.roots = tuple(dict.fromkeys(root.resolve() for root in [*given, sources_dir.parent]))
        # with a Ray cluster the nodes' GPUs run the jobs: this machine's do not count
        self.local_gpus = scheduler.cluster is None

    def run_request(
        self,
        problem: int | str,
        source: str | None,
        path: str | None,
        world_size: int,
        size: str,
        device: str | None,
        timeout_s: float,
        variant: str = "pkb",
        **more: Any,
    ) -> RunRequest:
        """A run tool's request: its candidate as a file, checked before any work starts (ToolErrors
        with one sentence)."""
        file = self.solution_file(source, path, (".py",))
        with tool_errors(str(problem), size):
            paired, _ = pairing.for_request(problem, file)  # the problem the run will use (its note then)
            p, dev = service.preflight(paired, world_size, size, device, self.local_gpus, variant)
            run.refuse_unrunnable(p, file, world_size, size, more.get("convention", "auto"))
        return RunRequest(
            problem=problem,
            path=str(file),
            world_size=world_size,
            size=size,
            variant=variant,
            device=dev,
            timeout_s=timeout_s,
            **more,
        )

    def solution_file(self, source: str | None, path: str | None, suffixes: tuple[str, ...]) -> Path:
        """The candidate as a file of the server's own, stored by content: given text as it is; a given
        path read once, confined to the roots (runs/run.py `read_confined`), kept under its own name
        (a check pairs a problem by the file's name). Every later read of the job reads this copy, so
        nothing the client changes on the machine afterwards can redirect it."""
        if (source is None) == (path is None):
            raise ToolError("give exactly one of source (the code as text) or path (a file on the server)")
        name: str | None = None  # a given file's own name; text is stored as {digest}{suffix}
        if path is not None:
            with tool_errors():
                name, data = run.read_confined(path, self.roots, suffixes, MAX_SOURCE_BYTES)
        else:
            assert source is not None
            data = source.encode()
        what = name or "the source"
        if not data.strip():
            raise ToolError(
                f"{what} is empty; send a file defining solution() with the reference's signature"
            )
        if len(data) > MAX_SOURCE_BYTES:
            raise ToolError(f"{what} is {len(data)} bytes, over the limit of {MAX_SOURCE_BYTES}")
        digest = hashlib.sha256(data).hexdigest()[:24]
        file = self.sources_dir / digest / name if name else self.sources_dir / f"{digest}{suffixes[0]}"
        if not file.exists():
            file.parent.mkdir(exist_ok=True)
            file.write_bytes(data)
        return file

    def output(self, record: JobRecord) -> JobOutput:
        cls = OUTPUTS[record.kind]
        fields: dict[str, Any] = {
            "job_id": record.id,
            "state": record.state,
            "message": record.message,
            "error": record.error,
            "result_uri": f"pkb://jobs/{record.id}/result",
        }
        raw = self.scheduler.result(record.id) if record.state == "done" else None
        if raw is not None:
            fields["result"] = compact(_parse(record.kind, raw))
        return cls(**fields)

    def result_of(self, record: JobRecord) -> CallToolResult:
        """What a tool returns for its finished job: the result, or for a failed job the tool's error."""
        if record.state == "failed":
            text = record.error or "the job failed"
            content = [TextContent(type="text", text=text)]
            return CallToolResult(content=content, structured_content={"error": text}, is_error=True)
        out = self.output(record)
        return reply(out, self.text(out, record.kind))

    async def finish(self, job_id: str, wait: bool, ctx: Context | None) -> CallToolResult:
        """Await the job (forwarding progress) or hand back its id; cancel it if the call is cancelled."""
        if wait:
            seen: tuple[float, str] | None = None
            try:
                while True:
                    record = self.scheduler.get(job_id)
                    if (
                        ctx is not None
                        and (record.progress, record.message) != seen
                        and record.state == "running"
                    ):
                        seen = (record.progress, record.message)
                        await ctx.report_progress(record.progress, record.total, record.message or None)
                    if record.terminal:
                        break
                    await anyio.sleep(POLL_S)
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    self.scheduler.cancel(job_id, "the client cancelled the request")
                raise
        record = self.scheduler.get(job_id)
        if record.state == "failed":
            raise ToolError(record.error or "the job failed")
        return self.result_of(record)

    def text(self, out: JobOutput, kind: str) -> str:
        """A job's output as text: its result as its verb renders it, else where the job stands."""
        head = f"job {out.job_id}: {out.state}"
        result = getattr(out, "result", None)
        if isinstance(result, BaseModel):
            return f"{head}\n{VERBS[kind].text(result, f'pkb://jobs/{out.job_id}')}"
        detail = out.error or out.message
        return (
            head
            + (f": {detail}" if detail else "")
            + ("; poll job_status, then job_result" if out.state in ("queued", "running") else "")
        )


def _parse(kind: str, raw: dict[str, Any]) -> BaseModel:
    return VERBS[kind].result.model_validate(raw)


def build_server(scheduler: Scheduler, sources_dir: Path, roots: Sequence[Path] | None = None) -> MCPServer:
    """The server: tools on problems, tools that run candidate code, the job tools, and the context an
    agent starts from (the reference resource and the attempt_problem prompt). A `path` argument must
    name a file under `roots` (default config.mcp_roots()) or the state folder."""
    from pkb_mcp.frontends.tasks import TasksExtension

    state = ServerState(scheduler, sources_dir, roots)
    mcp = _Server(
        name="pkb",
        title="pkb: multi-GPU kernel problems",
        instructions=INSTRUCTIONS,
        version=__import__("pkb_mcp").__version__,
        extensions=[TasksExtension(state)],
        cache_hints=CACHE_HINTS,
    )
    _add_problem_tools(mcp)
    _add_run_tools(mcp, state)
    _add_job_tools(mcp, scheduler, state)
    _add_profile(mcp, state)
    _add_agent_context(mcp)
    if missing := set(VERBS) - set(mcp.verb_tools):
        raise RuntimeError(f"no MCP tool runs the verbs {sorted(missing)} (VERBS)")
    return mcp


def _add_problem_tools(mcp: MCPServer) -> None:
    """list_problems, get_reference, roofline: read-only, answered at once."""

    @mcp.tool(annotations=READ_ONLY)
    def list_problems(
        category: Annotated[str | None, Arg(description="exact category, e.g. 'primitive', 'TP'")] = None,
        text: Annotated[str | None, Arg(description="text to find in name, summary, source")] = None,
        offset: Annotated[int, Arg(ge=0, description="skip this many")] = 0,
        limit: Annotated[int, Arg(ge=1, le=service.PAGE_LIMIT, description="at most this many")] = (
            service.PAGE_LIMIT
        ),
        detail: Annotated[bool, Arg(description="add source, dtype, world-size rule")] = False,
    ) -> Annotated[CallToolResult, ProblemPage]:
        """List the multi-GPU kernel problems to solve, a page at a time: id, name, category, summary."""
        with tool_errors(category or "", text or ""):
            page = service.problem_page(category, text, offset, limit, detail)
        return CallToolResult(
            content=[TextContent(type="text", text=render.problem_page(page))],
            structured_content=page.model_dump(mode="json", exclude_none=True),
        )

    @mcp.tool(annotations=READ_ONLY)
    def get_reference(
        problem: ProblemRef, world_size: WorldSize = 4, size: SizePreset = "pkb", variant: Variant = "pkb"
    ) -> Annotated[CallToolResult, ProblemDetail]:
        """Read a problem's contract before writing a solution: reference source, signature, per-rank
        input shapes, tolerance, traffic."""
        with tool_errors(str(problem), size):
            detail = service.show_problem(problem, world_size, size, variant)
        return reply(detail, render.show(detail) + "\n\nreference source:\n" + detail.reference_source)

    @mcp.tool(annotations=READ_ONLY)
    def roofline(
        problem: ProblemRef,
        world_size: WorldSize = 4,
        size: SizePreset = "pkb",
        time_ms: Annotated[
            float | None, Arg(gt=0, description="a measured time to place on the roofline")
        ] = None,
        variant: Variant = "pkb",
    ) -> Annotated[CallToolResult, RooflineResult]:
        """A problem's least possible time here, from NVLink bytes, HBM bytes and FLOPs per GPU and
        the node's ceilings; a measured time as % of that floor."""
        with tool_errors(str(problem), size):
            result = service.roofline_of(problem, world_size, size, time_ms, variant)
        return reply(result, render.roofline(result))


def _add_run_tools(mcp: _Server, state: ServerState) -> None:
    """compile_kernel, run_correctness, benchmark: candidate code in the sandbox, as scheduler jobs."""

    @mcp.verb_tool("compile")
    async def compile_kernel(
        ctx: Context,
        source: Source = None,
        path: SourcePath = None,
        language: Annotated[
            Literal["cuda", "python"],
            Arg(description="for source text: a .cu file, or a solution .py whose load_inline CUDA is built"),
        ] = "python",
        wait: Wait = True,
    ) -> Annotated[CallToolResult, OUTPUTS["compile"]]:
        """Build CUDA for sm_90a in the sandbox: errors by line, registers/smem/spills per kernel; a
        solution's load_inline extensions are also built for later checks."""
        suffixes = (".cu", ".cuh") if (language == "cuda" and path is None) else (".py", ".cu", ".cuh")
        file = state.solution_file(source, path, suffixes)
        job_id = state.scheduler.submit("compile", RunRequest(path=str(file)))
        return await state.finish(job_id, wait, ctx)

    @mcp.verb_tool("check")
    async def run_correctness(
        ctx: Context,
        problem: ProblemRef,
        source: Source = None,
        path: SourcePath = None,
        world_size: WorldSize = 4,
        size: SizePreset = "pkb",
        trials: Annotated[models.Trials, Arg(description="fresh random inputs per trial")] = 5,
        device: Device = None,
        timeout_s: Timeout = VERBS["check"].timeout_s,
        convention: Convention = "auto",
        variant: Variant = "pkb",
        unseen: Annotated[
            bool | None,
            Arg(description="after a pass, a trial at a size never shown (default: on)"),
        ] = None,
        wait: Wait = True,
    ) -> Annotated[CallToolResult, OUTPUTS["check"]]:
        """Judge a solution against the problem's reference on every rank over fresh random inputs:
        per-rank verdict, max error, first mismatch."""
        request = state.run_request(
            problem,
            source,
            path,
            world_size,
            size,
            device,
            timeout_s,
            variant,
            trials=trials,
            convention=convention,
            **({} if unseen is None else {"unseen": unseen}),
        )
        job_id = state.scheduler.submit("check", request)
        return await state.finish(job_id, wait, ctx)

    @mcp.verb_tool("bench")
    async def benchmark(
        ctx: Context,
        problem: ProblemRef,
        source: Source = None,
        path: SourcePath = None,
        world_size: WorldSize = 4,
        size: SizePreset = "pkb",
        device: Device = None,
        timeout_s: Timeout = VERBS["bench"].timeout_s,
        launches: Annotated[models.Launches, Arg(description=models.LAUNCHES_HELP)] = 1,
        convention: Convention = "auto",
        variant: Variant = "pkb",
        wait: Wait = True,
    ) -> Annotated[CallToolResult, OUTPUTS["bench"]]:
        """Time a correct solution against the reference on the same inputs: the speedup (or that it
        is within noise, not credited), its spread, % of floor."""
        request = state.run_request(
            problem,
            source,
            path,
            world_size,
            size,
            device,
            timeout_s,
            variant,
            launches=launches,
            convention=convention,
        )
        job_id = state.scheduler.submit("bench", request)
        return await state.finish(job_id, wait, ctx)


def _add_job_tools(mcp: MCPServer, scheduler: Scheduler, state: ServerState) -> None:
    """job_status, job_result, cancel_job and the full-result resource, for calls made with wait=false."""

    @mcp.tool(annotations=READ_ONLY)
    def job_status(job_id: Annotated[str, Arg(description="id from a wait=false call")]) -> JobRecord:
        """Where a job from a wait=false call stands, with its progress."""
        with tool_errors(job_id):
            return scheduler.get(job_id)

    @mcp.tool(annotations=READ_ONLY)
    def job_result(
        job_id: Annotated[str, Arg(description="id from a wait=false call")],
    ) -> Annotated[CallToolResult, AnyJobOutput]:
        """A job's result from a wait=false call (compacted; the full one is the resource in
        result_uri)."""
        with tool_errors(job_id):
            record = scheduler.get(job_id)
        out = state.output(record)
        result = getattr(out, "result", None)
        full = AnyJobOutput(
            kind=record.kind,
            **out.model_dump(exclude={"result"}),
            result=result.model_dump(mode="json") if result is not None else None,
        )
        return reply(full, state.text(out, record.kind))

    @mcp.tool(annotations=CANCELS)
    def cancel_job(job_id: Annotated[str, Arg(description="id from a wait=false call")]) -> JobRecord:
        """Cancel a queued or running job from a wait=false call (its processes are killed)."""
        with tool_errors(job_id):
            return scheduler.cancel(job_id)

    @mcp.resource("pkb://jobs/{job_id}/result", mime_type="application/json")
    def job_full_result(job_id: str) -> str:
        """The full result of a finished job: every rank's traceback and log tail, every timing figure."""
        raw = scheduler.result(job_id)
        if raw is None:
            raise ResourceError(f"job {echoed(job_id)} has no result (unknown, or not finished)")
        return _parse(scheduler.get(job_id).kind, raw).model_dump_json(indent=2)


def _add_profile(mcp: _Server, state: ServerState) -> None:
    """The profile tool, and its trace and timeline as resources (docs/measurement.md, "Profile")."""
    profiles = state.sources_dir.parent / "profiles"

    @mcp.verb_tool("profile")
    async def profile(
        ctx: Context,
        problem: ProblemRef,
        source: Source = None,
        path: SourcePath = None,
        world_size: WorldSize = 4,
        size: SizePreset = "pkb",
        device: Device = None,
        timeout_s: Timeout = VERBS["profile"].timeout_s,
        variant: Variant = "pkb",
        wait: Wait = True,
    ) -> Annotated[CallToolResult, OUTPUTS["profile"]]:
        """Profile a solution beside the reference: each rank's call split into communication,
        compute, overlap and gaps; waits, top kernels; trace and timeline as resources. Use when a
        benchmark disappoints."""
        request = state.run_request(
            problem, source, path, world_size, size, device, timeout_s, variant, profiles_dir=str(profiles)
        )
        job_id = state.scheduler.submit("profile", request)
        return await state.finish(job_id, wait, ctx)

    def artifact(job_id: str, name: str) -> Path:
        raw = state.scheduler.result(job_id)  # written by the host: its paths are ours, still checked
        entry = raw.get(name) if isinstance(raw, dict) else None
        where = Path(entry["path"]).resolve() if isinstance(entry, dict) and entry.get("path") else None
        allowed = (profiles.resolve(), profiles_root().resolve())
        if where is None or not where.is_file() or not any(where.is_relative_to(a) for a in allowed):
            raise ResourceError(
                f"job {echoed(job_id)} has no {name} (not a finished profile, or since removed)"
            )
        return where

    @mcp.resource("pkb://jobs/{job_id}/trace", mime_type="application/json")
    def profile_trace(job_id: str) -> str:
        """A profile job's trace: every rank of both sides, for Perfetto or chrome://tracing."""
        return artifact(job_id, "trace").read_text()

    @mcp.resource("pkb://jobs/{job_id}/timeline", mime_type="image/png")
    def profile_timeline(job_id: str) -> bytes:
        """A profile job's timeline (PNG): one call of each side across ranks and streams, by category."""
        return artifact(job_id, "timeline").read_bytes()


def _add_agent_context(mcp: MCPServer) -> None:
    """The reference as a resource, and the attempt_problem prompt."""

    @mcp.resource("problem://{problem_id}/reference", mime_type="text/x-python")
    def reference_source(problem_id: str) -> str:
        """The reference implementation of a problem (the contract a solution must meet)."""
        try:
            return service.show_problem(problem_id, world_size=2).reference_source
        except UserError as exc:
            raise ResourceError(shortened(in_tool_words(str(exc)), problem_id)) from exc

    @mcp.prompt()
    def attempt_problem(problem: str, world_size: str = "4", size: str = "pkb") -> str:
        """The task for an agent: reference, contract, per-rank shapes, hardware facts, hints and rules."""
        try:
            detail = service.show_problem(problem, int(world_size), size)
        except (UserError, ValueError) as exc:
            raise ValueError(str(exc)) from exc
        return attempt_text(detail)
