"""GNN sampling and sparse exchanges (64, 67, 68) and TorchRec's KJT all-to-all (70), both variants.

Fast tier: the original's signature and call are tests/test_problems.py's; its shapes hold on the meta
device at both sizes (and the `original` file's follow the original's builder), its world-size rule
says what it should, its traffic model is no larger than the schedules a solution could choose, and
the inputs make the exchange necessary (64: each rank holds only its own nodes' edges).
Integration tier (real ranks on CPU, process sandbox, one trial): a file of our own in the original
benchmark's convention passes both variants at world sizes 2 and 4 (64's loops over nodes in Python,
so it also shows that the vectorised reference returns the original's result on the same inputs),
and a candidate that skips the exchange fails as wrong."""

from __future__ import annotations

import inspect

import pytest
import torch

from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES
from .problems_common import cpu_inputs, problem

IDS = [64, 67, 68, 70]
BY_PROBLEM = CANDIDATES / "by_problem"


# ---------------------------------------------------------------- fast: format, shapes, rules


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_meta_shapes_and_traffic(pid, preset, world_size):
    p = problem(pid)
    assert p.world_size_error(world_size, preset) is None
    assert p.world_size_error(1, preset) is not None
    assert any("shape" in s for s in p.input_shapes(world_size, preset))
    t = p.traffic(world_size, preset)
    assert t["nvlink_bytes"] > 0 and t["hbm_bytes"] > 0 and t["flops"] >= 0
    if preset == "pkb":
        o = problem(pid, "original")
        assert any("shape" in s for s in o.input_shapes(world_size, "pkb"))
        assert o.traffic(world_size, "pkb")["hbm_bytes"] > 0


def test_shapes_are_the_originals():
    def shapes(pid, world_size, variant="pkb"):
        return [s.get("shape") for s in problem(pid, variant).input_shapes(world_size, "pkb")]

    # 64: 10000 nodes (rounded up to a multiple of W in the original), 16 edges a node, 512 seeds
    assert shapes(64, 8)[0] == [512] and shapes(64, 8)[2] == [10001] and shapes(64, 8)[4] == [10000]
    assert shapes(64, 8)[3] == [10000 * 16 // 8]  # the expected share: random per trial
    assert shapes(64, 3, "original")[:5] == [[512], None, [10003], [160032], [10002]]
    # 67: 1024 pairs of 128 bf16 values, num_nodes 100000 rounded up to a multiple of W
    for variant in ("pkb", "original"):
        assert shapes(67, 8, variant)[:2] == [[1024], [1024, 128]]
        assert cpu_inputs(67, 3, 0, variant=variant)[2] == 100002


def test_68_keeps_the_originals_table_per_rank_and_never_copies_it():
    for variant in ("pkb", "original"):
        p = problem(68, variant)
        assert p.lean_inputs, "a rank's shard is 7.1 GB or more: LEAN_INPUTS"
        shapes = [s.get("shape") for s in p.input_shapes(8, "pkb")]
        assert shapes[:3] == [[13_875_000, 256], [20000], [256, 256]]
    assert problem(68, "original").input_shapes(2, "pkb")[0]["shape"] == [55_500_000, 256]
    assert problem(68).input_shapes(2, "pkb")[0]["shape"] == [13_875_000, 256]
    # on a CPU device, the reduced table; the pkb ids reach every rank's rows, the original's pattern
    # sends Q / W to each owner
    shard, ids, proj, total, _ = cpu_inputs(68, 4, 0)
    assert shard.shape == (65536, 256) and total == 4 * 65536 and ids.numel() == 4096
    owners = torch.bincount(ids // 65536, minlength=4)
    assert owners.numel() == 4 and int(owners.min()) > 0
    shard, ids, _, total, _ = cpu_inputs(68, 4, 1, variant="original")
    assert torch.bincount(ids // (total // 4), minlength=4).tolist() == [5000] * 4
    assert float(proj.float().std()) == pytest.approx(1 / 16, rel=0.1), "outputs O(1)"


def test_70_shapes_and_empty_bags():
    for variant in ("pkb", "original"):
        shapes = problem(70, variant).input_shapes(8, "pkb")
        assert shapes[0]["shape"] == [15 * 512]  # key_splits 1, 2, 3, 1, 2, 3, 1, 2
    lengths, values, splits, batch, _ = cpu_inputs(70, 4, 1)
    assert splits == [1, 2, 3, 1] and batch == 512 and values.numel() == int(lengths.sum())
    assert int(lengths.min()) == 0 and int(lengths.max()) == 20, "empty bags occur (pkb)"
    lengths = cpu_inputs(70, 4, 1, variant="original")[0]
    assert int(lengths.min()) == 5 and int(lengths.max()) == 20


def test_67_splits_are_uneven_and_differ_by_rank():
    counts = [torch.bincount(cpu_inputs(67, 4, r, seed=7)[0] % 4, minlength=4) for r in range(4)]
    assert all(int(c.sum()) == 1024 for c in counts)
    assert max(int(c.max() - c.min()) for c in counts) > 100, "uniform indices would differ by ~60"
    assert len({tuple(c.tolist()) for c in counts}) == 4


# ---------------------------------------------------------------- fast: 64's graph


def test_64_ranks_hold_disjoint_parts_of_one_graph():
    """Every node's edges are on its owner alone, the same edges for the same seed on every rank's
    draw, and a rank finds no edge for a node it does not own (so skipping the exchange fails)."""
    w = 4
    ranks = [cpu_inputs(64, w, r, seed=5) for r in range(w)]
    node_to_rank = ranks[0][4]
    assert all(torch.equal(x[4], node_to_rank) for x in ranks)
    assert torch.bincount(node_to_rank, minlength=w).tolist() == [2500] * w
    degree = torch.zeros(10000, dtype=torch.int64)
    for r, (seeds, fanouts, row_ptr, col, *_rest) in enumerate(ranks):
        local = row_ptr.diff()
        assert (local[node_to_rank != r] == 0).all(), "no edges of another rank's nodes"
        assert int(row_ptr[-1]) == col.numel()
        degree += local
        assert seeds.unique().numel() == 512 and fanouts == [10, 5]
    assert int(degree.min()) >= 1 and int(degree.max()) <= 31
    assert not torch.equal(ranks[0][0], ranks[1][0]), "seeds differ per rank"


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("preset", ["pkb", "large"])
def test_traffic_is_no_more_than_the_alternatives(world_size, preset):
    w = world_size

    # 64: the reference's schedule (8-byte ids and counts per request, 16 bytes a sampled edge), or
    # replicating every rank's edges (8 bytes each) on every rank
    p = problem(64)
    ctx = p.context(w, preset, rank=0, device="meta")
    hops, _ = p.module._expected_hops(ctx)
    remote = (w - 1) / w
    reference = sum(remote * (16 * frontier + 16 * sampled) for frontier, sampled in hops)
    replicate = remote * ctx.size["nodes"] * ctx.size["mean_degree"] * 8
    t = p.traffic(w, preset)["nvlink_bytes"]
    assert 0 < t < reference and t < replicate

    # 67: every remote row with its index, 8 bytes in the reference's schedule
    s = problem(67).context(w, preset, rank=0, device="meta").size
    t = problem(67).traffic(w, preset)["nvlink_bytes"]
    assert (w - 1) / w * s["nnz"] * s["hidden"] * 2 < t < (w - 1) / w * s["nnz"] * (s["hidden"] * 2 + 8)

    # 68: 4-byte ids and the rows, against the reference's 8-byte ids
    s = problem(68).context(w, preset, rank=0, device="meta").size
    row = s["embed_dim"] * 2
    t = problem(68).traffic(w, preset)["nvlink_bytes"]
    assert (w - 1) / w * s["queries"] * row < t < (w - 1) / w * s["queries"] * (8 + row)

    # 70: the reference's schedule sends 8-byte lengths and ids; the floor counts 1 and 4 bytes, for
    # the busiest rank (rank 0 sends the most at W = 2, where it owns 1 of 3 features)
    c = problem(70).context(w, preset, rank=0, device="meta")
    splits = problem(70).module.key_splits(c.size, w)
    features, batch, mean = sum(splits), c.size["batch_size"], c.size["max_length"] / 2
    t = problem(70).traffic(w, preset)["nvlink_bytes"]
    heaviest = max(max(features - k, (w - 1) * k) for k in splits) * batch
    assert heaviest * (1 + 4 * mean) == t < heaviest * (8 + 8 * mean)


# ---------------------------------------------------------------- integration: real ranks on CPU


def check(pid, path, world_size, variant="pkb"):
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
@pytest.mark.parametrize("variant", ["pkb", "original"])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("pid", IDS)
def test_original_style_candidate_passes(pid, world_size, variant):
    r = check(pid, BY_PROBLEM / f"{pid:03d}_original_style.py", world_size, variant)
    assert r.verdict == "pass", r.message


# candidates that skip the exchange: the reference with one line changed (problem id, old, new)
MUTANTS = {
    # every frontier node asked of this rank itself: it samples only its own part of the graph
    "64_local_only": (64, "owner = node_to_rank[src]", "owner = torch.full_like(src, dist.get_rank(group))"),
    # every pair kept on this rank
    "67_keep_own": (67, "owner = idx % w", "owner = torch.full_like(idx, dist.get_rank(group))"),
}


# candidates that skip the exchange, written out: problem id and body
BODIES = {
    # each rank reads its own shard only
    "68_own_shard": (
        68,
        "return local_embedding_shard[input_node_ids % local_embedding_shard.shape[0]] @ proj_matrix",
    ),
    # each rank returns its own bags of the features it owns
    "70_own_bags": (
        70,
        "r, w = dist.get_rank(), dist.get_world_size()\n"
        "    first, local = sum(key_splits[:r]), key_splits[r]\n"
        "    bags = lengths.view(-1, batch_size)\n"
        "    skip = int(bags[:first].sum())\n"
        "    own = bags[first : first + local].reshape(-1)\n"
        "    return {'lengths': own, 'values': values[skip : skip + int(own.sum())].clone(),\n"
        "            'stride': torch.tensor(w * batch_size),\n"
        "            'stride_per_rank': torch.tensor([batch_size] * w)}",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("mutant", sorted(BODIES))
def test_fails_without_the_exchange_written_out(tmp_path, mutant):
    pid, body = BODIES[mutant]
    path = tmp_path / f"{pid:03d}_{mutant}.py"
    path.write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        f"def solution{inspect.signature(problem(pid).module.solution)}:\n    {body}\n"
    )
    r = check(pid, path, 2)
    assert r.verdict == "fail" and [rank.state for rank in r.ranks] == ["wrong", "wrong"], r.message


@pytest.mark.integration
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_fails_without_the_exchange(tmp_path, mutant):
    pid, old, new = MUTANTS[mutant]
    text = problem(pid).path.read_text()
    assert text.count(old) == 1
    path = tmp_path / f"{pid:03d}_{mutant}.py"
    path.write_text(text.replace(old, new))
    r = check(pid, path, 2)
    assert r.verdict == "fail" and [rank.state for rank in r.ranks] == ["wrong", "wrong"], r.message


@pytest.mark.integration
def test_68_float64_projection_passes():
    """A float64 projection of rows fetched by another schedule is within 68's tolerance."""
    r = check(68, BY_PROBLEM / "068_float64.py", 4)
    assert r.verdict == "pass", r.message
