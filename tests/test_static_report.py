"""The static report: what a solution's source still calls, read from its text (never imported)."""

from pathlib import Path

import pytest

from pkb_mcp.runs import static_report
from pkb_mcp.runs.static_report import analyze

from .conftest import ROOT

ADVERSARIAL = Path(__file__).resolve().parent / "adversarial"


def report(source: str):
    return analyze(source.strip() + "\n")


def test_collectives_through_every_import_form():
    """In order of first use (by line, then name)."""
    r = report(
        """
import torch
import torch.distributed as dist
from torch.distributed import all_gather_into_tensor as agit, barrier
from torch import distributed
import torch.distributed._functional_collectives as funcol


def solution(x):
    out = torch.empty_like(x)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    agit(out, x)
    distributed.reduce_scatter_tensor(out, x)
    torch.distributed.all_to_all_single(out, x)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1)])
    getattr(dist, "broadcast")(out, src=0)
    funcol.all_gather_tensor(x, 0, "0")
    torch.ops._c10d_functional.wait_tensor(out)
    barrier()
    return out
"""
    )
    assert r.collectives == [
        "all_gather_into_tensor",
        "barrier",
        "all_reduce",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "P2POp",  # three on one line: in name order
        "batch_isend_irecv",
        "isend",
        "broadcast",
        "all_gather_tensor",
        "c10d_functional.wait_tensor",
    ]
    assert r.compute_ops == [] and not r.multicast


def test_generic_names_count_only_when_they_resolve_to_torch_distributed():
    r = report(
        """
import functools
import torch
import torch.distributed as dist


def solution(x, idx, pg):
    total = functools.reduce(lambda a, b: a + b, [x, x])  # not a collective
    picked = torch.gather(x, 0, idx)  # a gather on one GPU
    pg.allreduce([x])  # a process group's method: distinctive name, counted
    dist.gather(x, dst=0)
    return total + picked
"""
    )
    assert r.collectives == ["allreduce", "gather"]


def test_symmetric_memory_ops_are_collectives_and_compute_ops_are_listed():
    r = report(
        """
import torch
import torch.nn.functional as F
import torch.distributed._symmetric_memory as symm_mem


def solution(a, b, w):
    buf = symm_mem.empty(a.shape, dtype=a.dtype, device=a.device)
    handle = symm_mem.rendezvous(buf, "0")
    out = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", "0")
    y = a @ b + torch.matmul(a, b) + F.linear(a, w) + a.mm(b)
    return torch.softmax(y, -1), torch.linalg.vector_norm(y)
"""
    )
    assert r.collectives == ["symm_mem.rendezvous", "symm_mem.one_shot_all_reduce"]
    assert r.compute_ops == [".mm()", "@", "F.linear", "matmul", "linalg.vector_norm", "softmax"]


@pytest.mark.parametrize(
    "body",
    [
        'torch.ops.symm_mem.multimem_all_reduce_(buf, "sum", "0")',
        'torch.ops.symm_mem.multimem_one_shot_all_reduce(buf, "sum", "0")',
        "ptr = handle.multicast_ptr",
        'os.environ["NCCL_NVLS_ENABLE"] = "1"',
        'os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "0"',
        'os.environ.update({"NCCL_ALGO": "NVLS"})',
        'os.environ["NCCL_NVLS_ENABLE"] = flag',
        'SRC = "asm volatile(\\"multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];\\");"',
        'SRC = "CUresult r = cuMulticastCreate(&handle, &prop);"',
    ],
)
def test_multicast_is_found_and_refused(body):
    source = f"""
import os
import torch
import torch.distributed._symmetric_memory as symm_mem


def solution(buf, handle, flag):
    {body}
    return buf
"""
    r = report(source)
    assert r.multicast, body
    assert r.multicast_uses and r.multicast_uses[0].startswith("line 7")
    assert static_report.refusal(r).startswith("refused: multicast is unavailable")


@pytest.mark.parametrize(
    "body",
    [
        'os.environ["NCCL_NVLS_ENABLE"] = "0"',  # keeps it off
        'os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")',
        "ok = handle.has_multicast_support()",  # asking is not using
        'SRC = "// no multimem.ld_reduce here: peers are read one by one\\n__global__ void k() {}"',
    ],
)
def test_what_keeps_multicast_off_or_only_mentions_it_is_not_refused(body):
    source = f'''
"""A docstring may say: this kernel does not use multimem.ld_reduce or NVLS."""
import os


def solution(buf, handle):
    {body}
    return buf
'''
    r = report(source)
    assert not r.multicast, r.multicast_uses
    assert static_report.refusal(r) is None


def test_suspicious_patterns_are_listed_with_lines():
    r = report(
        """
import ctypes
import os
import subprocess
import sys
import threading
import time

import torch
from harness import timing

_cache = {}
LIMITS = [1, 2]  # a constant list, never changed: not state


def solution(x):
    key = (x.data_ptr(), x.shape)
    if key in _cache:
        return _cache[key]
    secret = open("/launch/out/t0_r0.pkbt", "rb").read()
    home = os.environ.get("HOME")
    time.perf_counter = lambda: 0.0
    torch.cuda.synchronize = lambda: None
    setattr(torch.cuda, "Event", object)
    frame = sys._getframe(1).f_locals
    threading.Thread(target=print).start()
    if os.fork() == 0:
        os._exit(0)
    subprocess.run(["true"])
    _cache[key] = x
    return x
"""
    )
    text = "\n".join(r.suspicious)
    for words in [
        "line 1: uses ctypes",
        "line 3: runs other programs (subprocess)",
        "line 5: uses threads (threading)",
        "line 9: imports the harness",
        "line 11: state kept across calls (_cache)",
        "line 17: caches by data pointer or object id",
        "line 19: reads or writes files (open)",
        "line 20: reads or writes the environment",
        "line 21: monkeypatches time.perf_counter",
        "line 22: monkeypatches torch.cuda.synchronize",
        "line 23: monkeypatches torch.cuda (setattr)",
        "line 24: inspects the harness's frames",
        "line 26: forks processes (os.fork)",
    ]:
        assert words in text, (words, text)
    assert "LIMITS" not in text


def test_a_plain_reference_is_clean():
    r = analyze((ROOT / "problems" / "001_allreduce.py").read_text())
    assert r.collectives == ["all_reduce"] and r.compute_ops == []
    assert r.suspicious == [] and not r.multicast


def test_pointer_keys_are_told_apart_from_alignment_checks():
    aligned = report(
        """
def solution(x):
    if x.data_ptr() % 16:
        x = x.clone()
    return x
"""
    )
    assert aligned.suspicious == []
    cached = report(
        """
_seen = set()


def solution(x):
    if x.data_ptr() not in _seen:
        _seen.add(x.data_ptr())
    return x
"""
    )
    assert any("caches by data pointer" in s for s in cached.suspicious)


def test_every_adversarial_candidate_is_analyzable_and_the_hacks_show():
    found = {p.name: analyze(p.read_text()) for p in sorted(ADVERSARIAL.rglob("*.py"))}
    assert found["predicts_output.py"].collectives == []  # it never communicates
    assert found["only_rank0_correct.py"].collectives == ["reduce"]
    assert any("monkeypatches time.perf_counter" in s for s in found["patches_perf_counter.py"].suspicious)
    assert any("caches by data pointer" in s for s in found["cached_by_pointer.py"].suspicious)
    assert any("forks processes" in s for s in found["forges_after_return.py"].suspicious)
    assert found["uses_multicast.py"].multicast
    assert not any(r.multicast for name, r in found.items() if name != "uses_multicast.py")


def test_unparsable_source_raises_syntax_error():
    with pytest.raises(SyntaxError):
        analyze("def solution(x):\n    return x +\n")


def test_gpu_only_facilities_are_named_from_the_text():
    assert static_report.gpu_only("import torch.distributed._symmetric_memory as symm_mem\n") == [
        "torch symmetric memory"
    ]
    text = "EXT = load_inline('x', cpp_sources=A, cuda_sources=B)\nimport triton\n"
    assert static_report.gpu_only(text) == ["CUDA sources built with load_inline", "Triton"]
    assert static_report.gpu_only("import torch\ndef solution(x):\n    return x.clone()\n") == []


def test_ranks_that_failed_alike_are_told_once():
    from pkb_mcp import render
    from pkb_mcp.models import RankResult

    same = {"state": "error", "message": "raised RuntimeError: needs CUDA", "traceback": "Traceback\n  boom"}
    text = render.rank_table([RankResult(rank=0, **same), RankResult(rank=1, **same)])
    assert text.count("raised RuntimeError: needs CUDA") == 1 and "rank 1: as rank 0" in text
