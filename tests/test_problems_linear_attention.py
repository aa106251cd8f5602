"""Linear attention and context-shuffled attention (problems 74, 75, 77): the original's calling
convention, world-size rules, shapes and traffic on meta tensors, the chunked delta-rule references
against the step-by-step recurrence, inputs whose state carries across ranks, and (integration) the
files in the original's convention and other variants on real CPU ranks. tests/test_end_to_end.py
covers the reference passing and a perturbed one failing."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness import convention
from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs, problem

BY_PROBLEM = CANDIDATES / "by_problem"
ROOT = Path(__file__).resolve().parents[1]
FILES = {
    74: "074_fla_kimi_delta_attention_cp_tp.py",
    75: "075_fla_gated_deltanet_cp.py",
    77: "077_magi1_cso_async_attention.py",
}


# ------------------------------------------------------------------ calling convention and rules


def test_77_s_call_scales_its_tokens_with_the_world_size():
    """cp_shuffle_num is 4 and clip_token_nums W n, as the original's builder passes them."""
    p = problem(77)
    for w in (2, 4):
        ctx = p.context(w, "pkb")
        call = p.module.make_inputs(ctx)
        assert call[3] == 4 and call[4] == w * p.module.tokens_per_range(ctx) == w * 2700


def test_kda_called_in_the_originals_convention_gets_the_mesh_groups():
    p = problem(74)
    names = convention.parse_signature(p.module.ORIGINAL["signature"]).names
    assert names[-2:] == ("cp_group", "tp_group")
    assert tuple(inspect.signature(p.module.solution).parameters) == names[:-2]
    env = convention.meta_env(4, p.size("pkb"), p.torch_dtype)
    args = p.module.ORIGINAL["args"](p.module.make_inputs(p.context(4, "pkb")), env)
    assert len(args) == 9 and repr(args[7]) == "<cp process group>" and repr(args[8]) == "<tp process group>"


def test_world_size_rules_refuse_what_they_state():
    for w in (1, 2, 3, 5):
        assert problem(74).world_size_error(w, "pkb"), w
    for w in (4, 6, 8):
        assert problem(74).world_size_error(w, "pkb") is None
    assert problem(75).world_size_error(3, "pkb") is None
    assert problem(77).world_size_error(3, "pkb")  # 8 kv heads
    assert problem(77).world_size_error(16, "pkb") is None  # kv heads repeated
    assert problem(77).world_size_error(32, "pkb")  # 48 q heads


@pytest.mark.parametrize("pid", sorted(FILES))
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_shapes_on_meta_and_traffic_below_the_real_schedules(pid, world_size):
    p = problem(pid)
    w = world_size
    for preset in ("pkb", "large"):
        if p.world_size_error(w, preset):
            assert pid == 74 and w == 2
            continue
        shapes = {s["name"]: s.get("shape") for s in p.input_shapes(w, preset)}
        s = p.size(preset)
        t = p.traffic(w, preset)
        assert t["nvlink_bytes"] > 0 and t["hbm_bytes"] > 0 and t["flops"] > 0
        if pid == 74:
            assert shapes["q"] == [1, s["seq_local"], 16, 128]
            block = s["seq_local"] * 16 * (4 * 128 + 1) * 2
            output = s["seq_local"] * 16 * 128 * 2
            # the reference's all-gather (the last CP rank's share) or the bf16 state chain, plus the
            # peer's output block (the TP part)
            gather, state = (w // 2 - 1) * block, 16 * 128 * 128 * 2
            assert t["nvlink_bytes"] == pytest.approx(min(gather, state) + output)
            assert t["rounds"] == 2
        elif pid == 75:
            h = -(-s["heads"] // w) * w
            assert shapes["q"] == [1, s["seq_local"], h, 256] and shapes["a_log"] == [h // w]
            moved = (w - 1) / w * s["seq_local"] * h * (256 * 2 + 512 * 2 + 2) * 2
            assert t["nvlink_bytes"] == pytest.approx(min(moved, h * 256 * 512 * 2))
        else:
            n, r = s["tokens_per_range"], s["ranges"]
            assert shapes["query"] == [r * n, 48, 128] and shapes["key_value"] == [r * n, 8, 256]
            assert shapes["k_ranges"] == [r, 2]
            heads = (w - 1) / w * r * n * (2 * 48 * 128 + max(8, w) * 256) * 2
            ring = (w - 1) * r * n * 8 * 256 * 2
            assert t["nvlink_bytes"] == pytest.approx(min(heads, ring))


# ------------------------------------------------------------------ 74, 75: chunked form, inputs


def _recurrence64(q, k, v, decay, beta):
    """The delta rule step by step in float64: [n, S, K] q, k, decay; [n, S, V] v; [n, S] beta."""
    n, seq, kd = k.shape
    state = torch.zeros(n, kd, v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(seq):
        state = decay[:, t, :, None] * state
        u = (v[:, t] - torch.einsum("nk,nkv->nv", k[:, t], state)) * beta[:, t, None]
        state = state + k[:, t, :, None] * u[:, None, :]
        out.append(torch.einsum("nk,nkv->nv", q[:, t], state))
    return torch.stack(out, 1)


def _heads_first(t):
    b, s, h = t.shape[:3]
    return t.transpose(1, 2).reshape(b * h, s, *t.shape[3:])


def test_kda_chunked_reference_matches_the_recurrence():
    """200 tokens (3 chunks and a padded one) in 4 heads, the problem's input distribution."""
    q, k, v, g, beta, a_log, dt_bias = cpu_inputs(
        74, 4, 0, seed=3, size={"seq_local": 200, "heads": 4, "key_dim": 32}
    )
    got = problem(74).module.kda_heads(q, k, v, g, beta, a_log, dt_bias)
    h, kd = 4, 32
    decay = torch.exp(
        -5 * torch.sigmoid(a_log.double().exp()[:, None] * (g.double() + dt_bias.double().view(h, kd)))
    )
    qf = F.normalize(q.double(), dim=-1) * kd**-0.5
    want = _recurrence64(
        *(_heads_first(x) for x in (qf, F.normalize(k.double(), dim=-1), v.double(), decay)),
        _heads_first(beta.double().sigmoid()),
    )
    assert (_heads_first(got).double() - want).abs().max() < 1e-5
    assert want.pow(2).mean().sqrt() > 0.01


def test_gated_deltanet_chunked_reference_matches_the_recurrence():
    q, k, v, gate, beta, *_ = cpu_inputs(
        75, 2, 0, seed=4, size={"seq_local": 150, "heads": 3, "key_dim": 32, "value_dim": 48}
    )
    a_log, dt_bias = torch.rand(4) * 0.2, torch.rand(4) * 0.2 - 0.1
    got = problem(75).module.gated_delta_heads(q, k, v, gate, beta, a_log, dt_bias)
    decay = torch.exp(-a_log.double().exp() * F.softplus(gate.double() + dt_bias.double()))
    qf = F.normalize(q.double(), dim=-1, eps=1e-6) * 32**-0.5
    want = _recurrence64(
        _heads_first(qf),
        _heads_first(F.normalize(k.double(), dim=-1, eps=1e-6)),
        _heads_first(v.double()),
        _heads_first(decay.unsqueeze(-1)),
        _heads_first(beta.double()),
    )
    assert (_heads_first(got).double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("pid", [74, 75])
def test_the_state_carries_earlier_ranks_tokens(pid):
    """The last of 4 blocks computed from a zero state (no communication) is far off the tolerance:
    the decays keep the earlier blocks in the state (the original's inputs forget them in a few steps)."""
    m = problem(pid).module
    blocks = [cpu_inputs(pid, 4, r, seed=8) for r in range(4)]
    whole = [torch.cat([b[i] for b in blocks], dim=1) for i in range(5)]
    run = m.kda_heads if pid == 74 else m.gated_delta_heads
    params = blocks[0][5:7]
    if pid == 75:  # every head's parameters: the ranks' slices
        params = tuple(torch.cat([b[i] for b in blocks]) for i in (5, 6))
    n = blocks[0][0].shape[1]
    full = run(*whole, *params)[:, -n:]
    alone = run(*blocks[-1][:5], *params)
    rel = ((alone - full).norm() / full.norm()).item()
    assert rel > 10 * problem(pid).tolerance["rel_norm"], rel


def test_cso_inputs_are_reduced_on_cpu_and_windows_end_at_their_range():
    query, key_value, k_ranges, _, c, _ = cpu_inputs(77, 2, 1, seed=5)
    n = problem(77).size("pkb")["cpu_tokens_per_range"]
    assert query.shape == (4 * n, 48, 128) and key_value.shape == (4 * n, 8, 256) and c == 2 * n
    assert k_ranges[:, 1].tolist() == [c * (i + 1) for i in range(4)]
    assert (k_ranges[:, 0] >= 0).all() and (k_ranges[:, 0] <= torch.arange(4) * c).all()
    other = cpu_inputs(77, 2, 0, seed=5)[2]
    assert torch.equal(other, k_ranges), "the same windows on every rank"
    assert not torch.equal(cpu_inputs(77, 2, 1, seed=6)[2], k_ranges), "new windows in every trial"


# ------------------------------------------------------------------ integration: real ranks on CPU


def check(pid: int, path: Path, world_size: int, trials: int = 1):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=trials,
            timeout_s=120,
            sandbox="process",
        )
    )


CASES = [
    (74, "074_original_style.py", 4, None),  # the mesh groups passed, bf16 all-reduce, step by step
    (75, "075_original_style.py", 2, None),  # five all-to-alls, step by step
    (77, "077_original_style.py", 2, None),  # per-range overlapped all-to-alls, clipped keys
    (77, "077_float64.py", 2, None),  # token-parallel schedule, float64
    (75, "075_no_state.py", 2, "elements differ"),  # the halo-free shortcut the original allowed
]


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "name", "world_size", "failure"), CASES)
def test_original_convention_files_and_variants(pid, name, world_size, failure):
    r = check(pid, BY_PROBLEM / name, world_size)
    if failure is None:
        assert r.verdict == "pass", r.message
    else:
        assert r.verdict == "fail" and failure in r.message, r.message
