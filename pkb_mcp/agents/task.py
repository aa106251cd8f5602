"""An agent's task: the text of the attempt_problem prompt, and of the TASK.md an agent's attempt
starts from (pkb_mcp/agents/attempt.py): the problem, its contract, the hardware, hints and the
workflow, then the reference's source."""

from __future__ import annotations

from pkb_mcp import render
from pkb_mcp.models import ProblemDetail

HARDWARE = """\
Hardware: NVIDIA H200 GPUs on one node, all pairs linked by NVLink 4 through NVSwitch (about 395 GB/s
per direction between any two GPUs measured, 450 GB/s nominal), HBM3e about 4.3 TB/s measured, dense bf16
matmul about 790 TFLOP/s measured. NCCL all_reduce of 2 MiB takes ~0.050 ms; torch symmetric-memory
two-shot all-reduce ~0.021 ms. NVLink multicast (multimem / NVLS) is NOT available: never use it."""

HINTS = """\
Hints: small messages are latency-bound: symmetric memory (torch.distributed._symmetric_memory: empty,
rendezvous, one_shot_all_reduce, peer buffers and barriers) skips NCCL's launch and protocol costs.
Large ones are bandwidth-bound: overlap communication with compute (chunk the GEMM, copy-engine pulls
on a side stream, wait per chunk) and avoid extra HBM passes (fuse elementwise work, e.g. in Triton).
Allocate symmetric buffers once and reuse them, with a barrier so no peer still reads what you overwrite."""


CONTRACT = """\
Contract: a Python file defining {signature} with exactly this signature. It runs on every rank with
torch.distributed initialized (NCCL) and the rank's GPU set; it must return new tensors with the
reference's shapes and dtypes on every rank, leave its inputs unchanged, and be right on every call
(outputs are checked on fresh random inputs, on every rank, on every timed call). It may use
torch.distributed, symmetric memory, torch.utils.cpp_extension.load_inline and Triton."""

WORKFLOW = """\
Workflow: run_correctness until it passes, then benchmark (speedup against the reference, % of floor),
then roofline to see what is left. When a benchmark is slower than expected, or before deciding what to
overlap, profile: per rank, how much of a call is communication, compute, overlap and gaps, and which
rank the others wait for."""


def attempt_text(d: ProblemDetail) -> str:
    return "\n\n".join(
        [
            f"Write a faster multi-GPU implementation of problem {d.id} ({d.name}).",
            render.show(d),
            CONTRACT.format(signature=d.signature),
            HARDWARE,
            HINTS,
            WORKFLOW,
            "Reference source:\n" + d.reference_source,
        ]
    )
