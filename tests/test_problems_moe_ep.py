"""Expert-parallel MoE forward (problems 49, 50 and 51: balanced, wide and narrow EP): the original's
calling convention (nn.Linear arguments), per-rank shapes of both variants, world-size rules, a
routing drawn with a margin whose remote pairs the floor counts, floors no larger than either
schedule's bytes, and, through the real harness on CPU, the references passing, files in the
original's convention passing in both variants, a rank that skips the exchange failing, and the
example (examples/049_moe_ep_experts_to_tokens.py) passing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pkb_mcp import problems, service
from pkb_mcp.errors import UserError
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs

SUITE = problems.suite()
ORIGINAL_SUITE = problems.suite("original")
IDS = [49, 50, 51]
BY_PROBLEM = CANDIDATES / "by_problem"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "049_moe_ep_experts_to_tokens.py"

PARAMS = [
    "hidden_states",
    "gate_weight",
    "gate_bias",
    "gate_proj",
    "up_proj",
    "down_proj",
    "num_experts",
    "top_k",
    "group",
]


def narrow(world_size: int) -> int:
    """The original builder's E for problem 51: the largest divisor of W from 2 to W / 2, else 1."""
    return max([e for e in range(2, world_size // 2 + 1) if world_size % e == 0], default=1)


EXPERTS = {49: lambda w: w, 50: lambda w: 2 * w, 51: narrow}
PKB_WORLD_SIZES = {49: (2, 4, 8), 50: (2, 4, 8), 51: (4, 6, 8)}


def test_these_problems_are_in_both_variants():
    for pid in IDS:
        assert "Differences from the original:" in SUITE[pid].description
        assert ORIGINAL_SUITE[pid].name == SUITE[pid].name


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_pkb_shapes_are_the_original_s_per_rank(pid, world_size):
    e = EXPERTS[pid](world_size)
    want = [[1024, 1024], [e, 1024], [e]]
    for p in (SUITE[pid], ORIGINAL_SUITE[pid]):
        if world_size not in PKB_WORLD_SIZES[pid] and p.variant == "pkb":
            continue
        assert p.world_size_error(world_size, "pkb") is None
        shapes = [s["shape"] for s in p.input_shapes(world_size, "pkb") if "shape" in s]
        assert shapes == want
        linear = [s["value"] for s in p.input_shapes(world_size, "pkb") if "Linear" in s.get("value", "")]
        assert linear == [
            "Linear(in_features=1024, out_features=128, bias=True)",
            "Linear(in_features=1024, out_features=128, bias=True)",
            "Linear(in_features=128, out_features=1024, bias=True)",
        ]


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
def test_shapes_on_meta_and_traffic_at_both_sizes(pid, preset):
    p = SUITE[pid]
    for w in PKB_WORLD_SIZES[pid]:
        assert p.world_size_error(w, preset) is None
        for rank in (0, w - 1):
            assert p.input_shapes(w, preset, rank=rank)
        t = p.traffic(w, preset)
        assert t["nvlink_bytes"] > 0 and t["hbm_bytes"] > 0 and t["flops"] > 0 and t["rounds"] >= 1


@pytest.mark.parametrize(
    ("pid", "world_size", "reason"),
    [
        (49, 1, "at least 2 ranks"),
        (50, 1, "at least 2 ranks"),
        (51, 2, "narrow EP needs a world size with a divisor from 2 to W / 2"),
        (51, 5, "narrow EP needs a world size with a divisor from 2 to W / 2"),
    ],
)
def test_world_size_rules(pid, world_size, reason):
    assert reason in (SUITE[pid].world_size_error(world_size, "pkb") or "")


def test_51_original_has_one_expert_and_nothing_to_exchange_at_two_ranks():
    p = ORIGINAL_SUITE[51]
    assert p.world_size_error(2, "pkb") is None
    assert p.module.make_inputs(p.context(2, "pkb"))[6:] == (1, 1, None)
    assert p.traffic(2, "pkb")["nvlink_bytes"] == 0 and p.traffic(4, "pkb")["nvlink_bytes"] > 0


SMALL = {"tokens": 256, "hidden": 256, "inter": 32, "top_k": 2}


@pytest.mark.parametrize(("pid", "world_size"), [(49, 4), (50, 2), (50, 4), (51, 4), (51, 6)])
def test_routing_has_a_margin_and_exactly_the_remote_pairs_the_floor_counts(pid, world_size):
    """The bf16 router picks top_k experts on distinct ranks of the EP group, with a gap of more than
    0.9 between the chosen and the others' logits; exactly T k / ep of a rank's tokens use its own
    rank; the split sizes differ by rank; the router is the same on every rank, the MLPs are not."""
    experts = EXPERTS[pid](world_size)
    ep = experts if pid == 51 else world_size
    local = experts // ep
    per_rank, routers, mlps = [], [], []
    for rank in range(world_size):
        x, gw, gb, gate, _, _, e, k, _ = cpu_inputs(pid, world_size, rank, seed=5, size=SMALL)
        assert e == experts and x.dtype == torch.bfloat16 and not gate.weight.requires_grad
        logits = torch.nn.functional.linear(x, gw, gb).float()
        if k < experts:
            top = logits.topk(k + 1, dim=-1).values
            assert (top[:, k - 1] - top[:, k]).min() > 0.9
        owners = logits.topk(k, dim=-1).indices // local
        assert (owners[:, 0] != owners[:, 1]).all()
        own = (owners == rank % ep).any(dim=1)
        assert int(own.sum()) == SMALL["tokens"] * k // ep
        per_rank.append(torch.bincount(owners.reshape(-1), minlength=ep))
        routers.append(gw)
        mlps.append(gate.weight)
        assert x.float().std() == pytest.approx(1.0, rel=0.1)
    assert all(torch.equal(routers[0], r) for r in routers)
    assert not torch.equal(mlps[0], mlps[1])
    if ep > 2:
        assert len({tuple(c.tolist()) for c in per_rank}) > 1, "the split sizes vary by rank"


def schedules(pid: int, s: dict, world_size: int) -> dict[str, int]:
    """NVLink bytes per GPU, each way, of the two schedules in the problems' traffic docstrings (held
    to every floor by tests/test_floors.py)."""
    experts = EXPERTS[pid](world_size)
    ep = experts if pid == 51 else world_size
    remote = s["tokens"] * s["top_k"] - s["tokens"] * s["top_k"] // ep
    mlp = 3 * s["hidden"] * s["inter"] + 2 * s["inter"] + s["hidden"]
    return {
        "tokens to experts and back": 2 * remote * s["hidden"] * 2,
        "experts to tokens": (ep - 1) * mlp * 2,
    }


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
def test_the_stated_minimum_is_the_cheaper_schedule(pid, preset):
    p = SUITE[pid]
    for w in PKB_WORLD_SIZES[pid]:
        alternatives = schedules(pid, p.size(preset), w)
        assert p.traffic(w, preset)["nvlink_bytes"] == min(alternatives.values())


def test_each_schedule_is_the_cheaper_one_somewhere():
    """pkb: a 0.8 MB MLP costs less to fetch than 2 MB of tokens; large at W = 8: the tokens win."""
    small, large = schedules(49, SUITE[49].size("pkb"), 2), schedules(49, SUITE[49].size("large"), 8)
    assert min(small, key=small.get) == "experts to tokens"
    assert min(large, key=large.get) == "tokens to experts and back"


# ------------------------------------------------------------------- through the harness, on CPU


def check(pid: int, path: Path, world_size: int, variant: str = "pkb"):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=1,
            sandbox="process",
            variant=variant,
        )
    )


# the pkb variant at W = 4 is the reference's check (above): CI's budget
RUNS = [
    (pid, variant, w)
    for pid in IDS
    for variant, w in (("pkb", 2), ("original", 2), ("original", 4))
    if not (pid == 51 and variant == "pkb")
]


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "world_size"), [(pid, w) for pid, variant, w in RUNS if variant == "pkb"])
def test_the_reference_passes(pid, world_size):
    """(The original variant's reference runs in every check of that variant below.)"""
    r = check(pid, SUITE[pid].path, world_size)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "variant", "world_size"), RUNS)
def test_the_original_s_convention_passes(pid, variant, world_size):
    """Files written as the original's reference is (bf16 sums, host splits, a sort by local expert)
    pass unchanged in both variants, as each problem's "Differences from the original" says."""
    r = check(pid, BY_PROBLEM / f"{pid:03d}_original_style.py", world_size, variant)
    assert r.verdict == "pass", r.message


def test_51_is_refused_at_two_ranks_in_the_pkb_variant():
    with pytest.raises(UserError, match="narrow EP needs a world size"):
        check(51, SUITE[51].path, 2)


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "world_size"), [(49, 2), (50, 2), (51, 4)])
def test_a_rank_that_skips_the_exchange_fails(pid, world_size):
    r = check(pid, BY_PROBLEM / f"{pid:03d}_no_exchange.py", world_size)
    assert r.verdict == "fail" and all(rank.state == "wrong" for rank in r.ranks), r.message


@pytest.mark.integration
def test_the_example_passes_on_cpu_through_its_gloo_path():
    r = check(49, EXAMPLE, 2)
    assert r.verdict == "pass", r.message
