"""MoE routing and Ulysses all-to-all primitives (problems 24, 26, 30, 33, 34, 35, 36 and 37): the
original's calling convention,
per-rank shapes, world-size rules, inputs that a tolerance can judge, the schedules the floors are
held to (tests/test_floors.py), and, through the real harness on CPU, the reference passing as a candidate, a
perturbed one failing and files in the original's convention passing or failing as each problem's
"Differences from the original" states (tests/candidates/by_problem)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pkb_mcp import problems, service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs

SUITE = problems.suite()
IDS = [24, 26, 30, 33, 34, 35, 36, 37]
ORIGINAL = CANDIDATES / "by_problem"

# Per-rank tensor inputs at the pkb size: the original's defaults (../shared/problems-catalog.md),
# the same at every world size (35's rows are the largest a rank draws).
PKB_SHAPES = {
    24: [[1024, 8]],
    26: [[8, 2, 1024]],
    30: [[8, 1024], [8, 1024], [1024, 8]],
    33: [[1024, 1024]],
    34: [[1024, 1024]],
    35: [[1024, 1024]],
    36: [[16, 16, 8, 64]],
    37: [[16, 16, 8, 64]],
}


def test_these_problems_are_in_the_suite():
    assert set(IDS) <= set(SUITE)
    for pid in IDS:
        assert "Differences from the original:" in SUITE[pid].description


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_pkb_shapes_are_the_original_s_per_rank(pid, world_size):
    p = SUITE[pid]
    assert p.world_size_error(world_size, "pkb") is None
    shapes = [s["shape"] for s in p.input_shapes(world_size, "pkb") if "shape" in s]
    assert shapes == PKB_SHAPES[pid]


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_shapes_on_meta_and_traffic_at_both_sizes(pid, preset, world_size):
    p = SUITE[pid]
    assert p.world_size_error(world_size, preset) is None
    for rank in (0, world_size - 1):
        assert p.input_shapes(world_size, preset, rank=rank)
    t = p.traffic(world_size, preset)
    assert t["nvlink_bytes"] > 0 and t["hbm_bytes"] > 0 and t["rounds"] >= 1


@pytest.mark.parametrize(
    ("pid", "world_size", "reason"),
    [
        (24, 1, "at least 2 ranks"),
        (26, 3, "experts = 8 is not divisible"),
        (30, 1, "at least 2 ranks"),
        (33, 3, "rows = 1024 is not divisible"),
        (34, 1, "at least 2 ranks"),
        (35, 1, "at least 2 ranks"),
        (36, 3, "heads = 8 is not divisible"),
        (37, 3, "seq = 16 is not divisible"),
    ],
)
def test_world_size_rules(pid, world_size, reason):
    assert reason in (SUITE[pid].world_size_error(world_size, "pkb") or "")


def rank_loss(logits: torch.Tensor, experts: int, top_k: int) -> float:
    """Transformers' Mixtral auxiliary loss of one rank's tokens, in float64."""
    x = logits.double()
    selected = x.topk(top_k, dim=-1).indices
    counts = torch.zeros(experts, dtype=torch.float64).index_add_(
        0, selected.reshape(-1), torch.ones(selected.numel(), dtype=torch.float64)
    )
    return float(experts * (counts / x.shape[0]) @ torch.softmax(x, dim=-1).mean(dim=0))


@pytest.mark.parametrize("world_size", [2, 4])
def test_24_every_rank_s_own_loss_is_far_from_the_mean(world_size):
    """A rank that skips the all-reduce is off by far more than the 1% the tolerance allows."""
    tol = SUITE[24].tolerance["rtol"]
    for seed in range(20):
        losses = [rank_loss(cpu_inputs(24, world_size, r, seed)[0], 8, 2) for r in range(world_size)]
        mean = sum(losses) / world_size
        assert max(abs(loss - mean) / mean for loss in losses) > 5 * tol
        assert all(1.0 < loss < 16.0 for loss in losses)


def test_26_mask_is_one_hot_with_distinct_experts_per_token():
    mask = cpu_inputs(26, 2, 1, 5)[0]
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(mask.sum(dim=0), torch.ones(2, 1024)), "one expert per (choice, token)"
    assert int(mask.sum(dim=1).max()) == 1, "a token picks an expert at most once"
    counts = mask.sum(dim=(1, 2))
    assert counts.max() > 1.5 * counts.mean(), "routing is uneven"


def test_35_row_counts_differ_by_rank_and_trial_within_the_stated_range():
    size = SUITE[35].size("pkb")
    rows = {(r, s): cpu_inputs(35, 4, r, s)[0].shape[0] for r in range(4) for s in range(6)}
    assert len(set(rows.values())) > 6
    assert all(size["rows"] * 7 // 8 <= n <= size["rows"] for n in rows.values())


class SimulatedAllToAll:
    """A stand-in for torch.distributed with W ranks in one process, for all_to_all_single only: each
    rank's call is run twice, first to record what it sends, then to deliver what the others sent."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.rank = 0
        self.delivering = False
        self.sent: dict[int, torch.Tensor] = {}

    def get_world_size(self, group=None):
        return self.world_size

    def all_to_all_single(self, output, input, group=None):
        if not self.delivering:
            self.sent[self.rank] = input.clone()
            return
        chunks = [self.sent[j].reshape(self.world_size, -1)[self.rank] for j in range(self.world_size)]
        output.copy_(torch.stack(chunks).reshape(output.shape))

    def run(self, call, per_rank_inputs):
        outs = []
        for self.delivering in (False, True):
            outs = []
            for self.rank, x in enumerate(per_rank_inputs):
                outs.append(call(x))
        return outs


def expected_all_to_all(xs, rank, scatter_dim, gather_dim):
    w = len(xs)
    return torch.cat([torch.tensor_split(x, w, scatter_dim)[rank] for x in xs], dim=gather_dim)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(
    ("pid", "shape", "scatter_dim", "gather_dim"),
    [
        (33, (8, 12), 0, 1),
        (33, (8, 12), 1, 0),
        (33, (4, 8, 12), -1, 0),
        (36, (2, 3, 8, 5), 2, 1),
        (36, (8, 3, 4, 5), 0, 3),
        (37, (2, 8, 3, 5), 1, 2),
        (37, (2, 3, 5, 8), -1, 1),
    ],
)
def test_the_ulysses_exchanges_work_for_any_pair_of_dimensions(
    pid, shape, scatter_dim, gather_dim, world_size, monkeypatch
):
    """The references of 33, 36 and 37 handle the dimensions they are given, not only the call's."""
    fake = SimulatedAllToAll(world_size)
    monkeypatch.setattr(SUITE[pid].module, "dist", fake)
    xs = [torch.randn(*shape) for _ in range(world_size)]
    solution = SUITE[pid].module.solution
    if pid == 33:
        outs = fake.run(lambda x: solution(x, scatter_dim, gather_dim), xs)
    elif pid == 36:  # scatters the heads, gathers the sequence
        outs = fake.run(lambda x: solution(x, gather_dim, scatter_dim), xs)
    else:  # 37 scatters the sequence, gathers the heads
        outs = fake.run(lambda x: solution(x, scatter_dim, gather_dim), xs)
    for rank, out in enumerate(outs):
        assert torch.equal(out, expected_all_to_all(xs, rank, scatter_dim, gather_dim))


def test_36_cuts_the_gathered_sequence_to_unpadded_dim_size(monkeypatch):
    fake = SimulatedAllToAll(2)
    monkeypatch.setattr(SUITE[36].module, "dist", fake)
    xs = [torch.randn(2, 3, 4, 5) for _ in range(2)]
    outs = fake.run(lambda x: SUITE[36].module.solution(x, 1, 2, None, 5), xs)
    for rank, out in enumerate(outs):
        assert torch.equal(out, expected_all_to_all(xs, rank, 2, 1)[:, :5])


class ThreadedAllGather:
    """A stand-in for torch.distributed with W ranks as threads of one process, for the all-gathers
    of problem 35 (all_gather_single, all_gather_into_tensor)."""

    def __init__(self, world_size: int):
        import threading

        self.world_size = world_size
        self.local = threading.local()
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def get_world_size(self, group=None):
        return self.world_size

    def all_gather_single(self, output, input, group=None):
        self.slots[self.local.rank] = input.clone()
        self.barrier.wait()
        output.copy_(torch.cat([t for t in self.slots if t is not None]).reshape(output.shape))
        self.barrier.wait()

    all_gather_into_tensor = all_gather_single

    def run(self, call, per_rank_inputs):
        from concurrent.futures import ThreadPoolExecutor

        def one(rank):
            self.local.rank = rank
            return call(per_rank_inputs[rank])

        with ThreadPoolExecutor(self.world_size) as pool:
            return list(pool.map(one, range(self.world_size)))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("gather_dim", [0, 1, -1])
def test_35_gathers_unequal_lengths_along_any_dimension(gather_dim, world_size, monkeypatch):
    module = SUITE[35].module
    fake = ThreadedAllGather(world_size)
    monkeypatch.setattr(module, "dist", fake)
    monkeypatch.setattr(module, "_all_gather", fake.all_gather_single)
    shape = [4, 5, 6]
    xs = []
    for rank in range(world_size):
        shape[gather_dim] = 3 + 2 * rank
        xs.append(torch.randn(*shape))
    outs = fake.run(lambda x: module.solution(x, gather_dim), xs)
    for out in outs:
        assert torch.equal(out, torch.cat(xs, dim=gather_dim))


# ------------------------------------------------------------------------- floors against schedules


def schedules(pid: int, s: dict, w: int, isz: int) -> dict[str, float]:
    """Bytes each GPU sends over NVLink in the schedules a solution of problem `pid` may choose,
    written out independently of the problem files; tests/test_floors.py holds every floor to them
    (and to the cheapest of them)."""
    if pid == 24:  # one float32 loss per rank, averaged over the ranks
        return {
            "one-shot all-reduce": (w - 1) * 4,
            "recursive doubling (W a power of 2)": math.log2(w) * 4,
            # the partial sum once around a ring, then the total: one message each way per GPU
            "reduce around a ring, then broadcast around it": 4 if w == 2 else 8,
        }
    if pid == 26:  # E counts per rank; rank r needs every peer's counts of its E/W experts
        e = s["experts"]
        return {
            "all-gather every count (the reference)": (w - 1) * e * 4,
            "all-to-all of the E/W counts each peer needs": (w - 1) * (e // w) * 4,
        }
    if pid == 30:  # all-reduce of the three gradients
        nbytes = 3 * s["lora_rank"] * s["hidden"] * isz
        return {
            "reduce-scatter + all-gather (ring)": 2 * (w - 1) / w * nbytes,
            "one-shot all-reduce": (w - 1) * nbytes,
        }
    if pid in (33, 36, 37):  # all-to-all of x
        dims = {33: ("rows", "cols"), 36: ("batch", "seq_local", "heads", "head_dim")}
        dims[37] = ("batch", "seq", "heads_local", "head_dim")
        nbytes = math.prod(s[d] for d in dims[pid]) * isz
        return {
            "all-to-all, each block to its owner": (w - 1) / w * nbytes,
            "all-gather x, each rank keeps its blocks": (w - 1) * nbytes,
        }
    if pid == 34:  # all-gather of x
        nbytes = s["rows"] * s["cols"] * isz
        return {"direct all-gather": (w - 1) * nbytes, "ring all-gather": (w - 1) * nbytes}
    if pid == 35:  # variable all-gather: at least the fewest rows a rank draws
        fewest = (s["rows"] - s["rows"] // 8) * s["cols"] * isz
        return {
            "exact rows after a length exchange": (w - 1) * (fewest + 8),
            "pad every rank to the most rows": (w - 1) * (s["rows"] * s["cols"] * isz + 8),
        }
    raise KeyError(pid)


@pytest.mark.parametrize("pid", [26, 30, 33, 36, 37])
def test_a_cheaper_schedule_than_the_obvious_one_exists_at_four_ranks(pid):
    """Where the alternatives differ, the floor is the cheaper one, not the reference's."""
    p = SUITE[pid]
    alternatives = schedules(pid, p.size("pkb"), 4, p.torch_dtype.itemsize)
    assert p.traffic(4, "pkb")["nvlink_bytes"] < max(alternatives.values())


# ------------------------------------------------------------------- through the harness, on CPU


def check(pid: int, path: Path, world_size: int, trials: int = 1):
    return service.check(
        RunRequest(
            problem=pid, path=path, world_size=world_size, device="cpu", trials=trials, sandbox="process"
        )
    )


# Each file in the original's convention, and what its problem's docstring says it does: passes, or
# fails with this message.
ORIGINAL_STYLE = [
    ("024_original_style.py", None),
    ("026_original_style.py", None),
    ("030_original_style.py", None),
    ("033_original_style.py", None),
    ("034_original_style.py", None),
    ("035_original_style.py", None),
    ("036_original_style.py", None),
    ("037_original_style.py", None),
]


@pytest.mark.integration
@pytest.mark.parametrize(("name", "failure"), ORIGINAL_STYLE)
def test_original_style_file_passes_or_fails_as_stated(name, failure):
    # at 2 ranks (as tests/test_problems_ring_losses_vocab.py's)
    r = check(int(name[:3]), ORIGINAL / name, 2, trials=1)
    if failure is None:
        assert r.verdict == "pass", r.message
    else:
        assert r.verdict == "fail" and failure in r.message, r.message


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "failure"),
    [
        ("024_original_style_reshaped.py", "output 0 is float32[1], expected float32[]"),
        ("024_no_allreduce.py", "elements differ"),
        ("026_original_style_lists.py", "output 0: expected tensor, got a tuple or list of 2"),
        # the sums in copies, the inputs untouched: the in-place results (outputs 3-5) are wrong
        ("030_original_style_copies.py", "first at output 3"),
    ],
)
def test_variants_pass_or_fail(name, failure):
    r = check(int(name[:3]), ORIGINAL / name, 2)
    if failure is None:
        assert r.verdict == "pass", r.message
    else:
        assert r.verdict == "fail" and failure in r.message, r.message


@pytest.mark.integration
def test_an_in_place_workload_is_benchmarked_on_fresh_copies():
    """Problem 30 updates its inputs in place (`MUTATES_INPUTS`): every timed call gets a fresh copy
    of its set, and the timed calls' outputs, the in-place inputs included, are compared with the
    judged ones (before, every such benchmark stopped with "outputs changed while timing")."""
    path = SUITE[30].path
    r = service.bench(RunRequest(problem=30, path=path, world_size=2, device="cpu", sandbox="process"))
    assert r.verdict == "pass", r.message
    assert r.candidate is not None and r.candidate.samples >= 10
