"""The expert-parallel MoE layer forward, plain (31) and with LoRA adapters (32), in both variants.

Fast tier: the call's nn.Linear arguments hold bf16 with a bias (the original's signature and call:
tests/test_problems.py),
its shapes hold on the meta device at both sizes and are the original's at the pkb size, its
world-size rule says what it should, its inputs keep the top-k choice clear of ties and give both
choices weight, the original variant draws what the original's builder draws, and the traffic
model is the least of the two schedules it names (the expected figures checked by enumeration).
Integration tier (real ranks on CPU, process sandbox, one trial): the reference passes at W = 2
and 4; a file in the original's convention passes in both variants at W = 2 and 4; float64
solutions by the other schedule pass; without the exchange, or without the adapters, a solution
fails as wrong."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs, problem

IDS = [31, 32]
BY_PROBLEM = CANDIDATES / "by_problem"


# ---------------------------------------------------------------- fast: format, shapes, rules


@pytest.mark.parametrize("variant", ["pkb", "original"])
@pytest.mark.parametrize("pid", IDS)
def test_the_projections_are_bf16_linear_layers_needing_grad_only_in_the_original(pid, variant):
    """The call's kinds are tests/problems_common.py's; here what they hold: bf16 tensors, nn.Linear
    with a bias, whose parameters require gradients in the original (pkb's are a forward's inputs)."""
    inputs = cpu_inputs(pid, 4, rank=1, variant=variant)
    assert all(v.dtype == torch.bfloat16 for v in inputs if isinstance(v, torch.Tensor))
    layers = [v for v in inputs if isinstance(v, torch.nn.Linear)]
    assert len(layers) == 3 and all(m.bias is not None and m.weight.dtype == torch.bfloat16 for m in layers)
    assert all(m.weight.requires_grad == (variant == "original") for m in layers)


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_meta_shapes_and_traffic(pid, preset, world_size):
    p = problem(pid)
    shapes = p.input_shapes(world_size, preset)
    s = p.size(preset)
    assert shapes[0]["shape"] == [s["tokens"], s["hidden"]]
    assert "Linear(in_features=" in shapes[3]["value"]
    traffic = p.traffic(world_size, preset)
    assert traffic["nvlink_bytes"] > 0 and traffic["hbm_bytes"] > 0 and traffic["flops"] > 0


@pytest.mark.parametrize("variant", ["pkb", "original"])
@pytest.mark.parametrize("world_size", [2, 8])
def test_pkb_shapes_are_the_originals_per_rank(variant, world_size):
    def shapes(pid):
        return [s.get("shape") for s in problem(pid, variant).input_shapes(world_size, "pkb")]

    assert shapes(31)[:3] == [[1024, 1024], [8, 1024], [8]]
    assert shapes(32)[6:12] == [[8, 1024], [128, 8], [8, 1024], [128, 8], [8, 128], [1024, 8]]
    gate_proj, up_proj, down_proj = cpu_inputs(31, 2, 0, variant=variant)[3:6]
    assert gate_proj.weight.shape == up_proj.weight.shape == (128, 1024)
    assert down_proj.weight.shape == (1024, 128)


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize(("world_size", "allowed"), [(1, False), (2, True), (3, False), (4, True), (8, True)])
def test_world_size_rules(pid, world_size, allowed):
    for variant in ("pkb", "original"):
        assert (problem(pid, variant).world_size_error(world_size, "pkb") is None) == allowed


@pytest.mark.parametrize("pid", IDS)
def test_routing_has_no_near_tie_and_both_choices_weigh(pid):
    """bf16 and float64 routers choose the same experts for every token; the two weights are about
    0.40 and 0.24; the loads differ by rank and by trial; the router is shared, the MLPs are not."""
    by_rank = [cpu_inputs(pid, 4, r) for r in range(4)]
    loads = []
    for x, gate, bias, *_ in by_rank:
        probs = torch.softmax(F.linear(x, gate, bias), dim=-1)
        weights, chosen = probs.topk(2, dim=-1)
        chosen64 = torch.softmax(F.linear(x.double(), gate.double(), bias.double()), dim=-1).topk(2).indices
        assert torch.equal(chosen.sort(1).values, chosen64.sort(1).values)
        assert weights[:, 1].float().min() > 0.2 and weights[:, 0].float().max() < 0.45
        loads.append(torch.bincount(chosen.flatten(), minlength=8))
    assert len({tuple(c.tolist()) for c in loads}) == 4, "each rank routes its own way"
    assert cpu_inputs(pid, 4, 0, seed=2)[0].ne(by_rank[0][0]).any()
    assert torch.equal(by_rank[0][1], by_rank[3][1]), "one router for the layer"
    assert not torch.equal(by_rank[0][3].weight, by_rank[1][3].weight), "each rank its own MLP"


def test_the_original_variant_draws_as_the_originals_builder():
    """N(0, 1) tokens and router (so logits of standard deviation about 32), nn.Linear's default
    uniform initialisation, N(0, 1) adapters."""
    x, gate, bias, gate_proj, up_proj, down_proj, *lora = cpu_inputs(32, 2, 0, variant="original")[:12]
    assert 0.9 < float(x.float().std()) < 1.1 and 0.9 < float(gate.float().std()) < 1.1
    assert float(F.linear(x, gate, bias).float().std()) > 25
    for layer, fan_in in ((gate_proj, 1024), (up_proj, 1024), (down_proj, 128)):
        bound, weight = fan_in**-0.5, layer.weight.detach()
        assert float(weight.abs().max()) <= bound * 1.01
        assert float(weight.float().std()) == pytest.approx(bound / 3**0.5, rel=0.05)
    assert all(0.8 < float(t.float().std()) < 1.2 for t in lora)


# ---------------------------------------------------------------- fast: traffic against alternatives


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_expected_ranks_by_enumeration(world_size):
    """The expected count of distinct owners (and of remote ones, from rank 0) over every set of 2
    of the 8 experts."""
    local = 8 // world_size
    owners = [len({e // local for e in pair}) for pair in itertools.combinations(range(8), 2)]
    remote = [len({e // local for e in pair} - {0}) for pair in itertools.combinations(range(8), 2)]
    got = problem(31).module.expected_ranks(world_size, 8, 2)
    assert got == pytest.approx((sum(owners) / len(owners), sum(remote) / len(remote)))


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_traffic_is_the_least_of_the_two_schedules(pid, preset, world_size):
    p = problem(pid)
    s, w = p.size(preset), world_size
    _, remote = problem(31).module.expected_ranks(w, s["experts"], s["top_k"])
    # the reference's own schedule: every (token, choice) pair out and back
    pairs = 2 * s["tokens"] * s["top_k"] * (w - 1) / w * s["hidden"] * 2
    # tokens once per remote owner, out and back
    tokens = 2 * s["tokens"] * remote * s["hidden"] * 2
    # the other ranks' (adapted) MLPs
    mlp = 3 * s["hidden"] * s["inter"] + 2 * s["inter"] + s["hidden"]
    if pid == 32:
        mlp += 3 * s["rank"] * (s["hidden"] + s["inter"])
    weights = (w - 1) * mlp * 2
    t = p.traffic(w, preset)["nvlink_bytes"]
    assert t == pytest.approx(min(tokens, weights))
    # an owner of both of a token's experts needs it once (none is, with one expert per rank)
    assert tokens < pairs if s["experts"] > w else tokens == pytest.approx(pairs)
    assert t == pytest.approx(weights), "at these sizes gathering the MLPs is the cheaper schedule"
    assert problem(pid, "original").traffic(w, "pkb")["nvlink_bytes"] == p.traffic(w, "pkb")["nvlink_bytes"]


# ---------------------------------------------------------------- integration: real ranks on CPU


def check(pid: int, path: Path, world_size: int, variant: str = "pkb"):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=1,
            timeout_s=600,
            sandbox="process",
            variant=variant,
        )
    )


@pytest.mark.integration
@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("world_size", [2, 4])
def test_reference_passes(pid, world_size):
    r = check(pid, problem(pid).path, world_size)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize(("variant", "world_size"), [("pkb", 2), ("original", 2), ("original", 4)])
def test_original_style_candidate_passes_in_both_variants(pid, world_size, variant):
    name = "fused_moe_fwd" if pid == 31 else "fused_moe_fwd_lora"
    r = check(pid, BY_PROBLEM / f"{pid:03d}_original_style.py", world_size, variant)
    assert r.verdict == "pass", r.message
    assert f"{pid:03d}_{name}" in str(problem(pid, variant).path)


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "world_size"), [(31, 4), (32, 2)])
def test_float64_candidate_by_the_weight_schedule_passes(pid, world_size):
    r = check(pid, BY_PROBLEM / f"{pid:03d}_float64.py", world_size)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
@pytest.mark.parametrize(
    ("pid", "name", "world_size"),
    [(31, "031_no_exchange.py", 2), (32, "032_no_exchange.py", 2), (32, "032_no_adapters.py", 4)],
)
def test_a_shortcut_fails_as_wrong(pid, name, world_size):
    r = check(pid, BY_PROBLEM / name, world_size)
    assert r.verdict == "fail", r.message
    assert [rank.state for rank in r.ranks] == ["wrong"] * world_size, r.message
    assert all(rank.rel_norm_error is not None and rank.rel_norm_error > 0.1 for rank in r.ranks)
