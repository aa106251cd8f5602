"""Ulysses with QKV and end to end (38, 39), GNN feature exchange and scoring (65, 66, 69), Hyena
(72) and halo convolutions (76, 87), and the example for 72.

Fast tier: the original's signature and call are tests/test_problems.py's; its shapes hold on the meta
device at both sizes, its world-size rule says what it should, its traffic model is no larger than
the schedules a solution could choose instead, and the semantics the CPU runs cannot reach (72's
causal FFT convolution and zigzag order) are checked against a direct computation.
Integration tier (real ranks on CPU, process sandbox): the reference passes as a candidate at world
sizes 2 and 4, a perturbed reference fails, a candidate written in the original benchmark's
convention passes or fails for the reason its problem states, float64 versions pass (the
tolerances hold), and the example for 72 matches the reference, also in the configurations the pkb
size does not reach (filter groups, channel chunks, no zigzag)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from harness.context import ProblemContext
from pkb_mcp import service
from pkb_mcp.models import RunRequest

from .conftest import CANDIDATES, ROOT
from .problems_common import CALLS, cpu_inputs, problem

IDS = [38, 39, 65, 66, 69, 72, 76, 87]
BY_PROBLEM = CANDIDATES / "by_problem"
EXAMPLE_72 = ROOT / "examples" / "072_hyena_forward_cp_fused_a2a.py"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- fast: format, shapes, rules


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("preset", ["pkb", "large"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_meta_shapes_and_traffic(pid, preset, world_size):
    p = problem(pid)
    if p.world_size_error(world_size, preset):
        pytest.skip(f"world size {world_size} not allowed for {p.name} {preset}")
    shapes = p.input_shapes(world_size, preset)
    assert any("shape" in s for s in shapes)
    traffic = p.traffic(world_size, preset)
    assert traffic["nvlink_bytes"] > 0 and traffic["hbm_bytes"] > 0 and traffic["flops"] >= 0


def test_pkb_shapes_are_the_originals_at_world_size_8():
    def shapes(pid, rank=0):
        return [s.get("shape") for s in problem(pid).input_shapes(8, "pkb", rank=rank)]

    assert shapes(38)[0] == [16, 16, 1536]
    assert shapes(39)[:3] == [[16, 2, 512], [1536, 512], [512, 512]]
    assert shapes(65)[:2] == [[768, 128], [1024]]
    assert shapes(66)[:2] == [[1024, 128], [1024]]
    assert [shapes(69, r)[0] for r in range(8)] == [[128 + r % 3] for r in range(8)]
    assert shapes(69)[1] == [128, 1000]
    assert shapes(72)[:4] == [[1, 1024, 2048]] * 3 + [[1024, 4096]]
    assert shapes(76)[:2] == [[1, 64, 19, 66, 66], [512, 64, 3, 3, 3]]
    assert shapes(87)[:2] == [[1, 1280, 32, 128], [1280, 1280, 3, 3]]


@pytest.mark.parametrize(
    ("pid", "world_size", "allowed"),
    [
        (38, 3, False),  # 8 heads
        (39, 3, False),
        (39, 8, True),
        (65, 3, True),
        (66, 5, True),
        (69, 3, True),
        (72, 3, False),  # 1024 groups
        (72, 16, True),
        (76, 3, False),  # 512 input channels
        (87, 3, True),
        (87, 1, False),
    ],
)
def test_world_size_rules(pid, world_size, allowed):
    assert (problem(pid).world_size_error(world_size, "pkb") is None) == allowed


def test_72_filter_must_fit_the_sequence():
    size = {**problem(72).size("pkb"), "filter_len": 8192}
    assert problem(72).module.check_world_size(2, size) is not None
    assert problem(72).module.check_world_size(4, size) is None


@pytest.mark.parametrize("pid", [65, 66])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_request_counts_agree_between_ranks(pid, world_size):
    """Chunks are numbered by distance: chunk j of what rank r receives (counts_sent[j] rows in 65,
    counts_received[j] in 66's backward) is chunk W - j of rank (r + j) % W's; every rank sends and
    receives `ids` rows; the counts change with the trial (from W = 3: at W = 2 the split is fixed);
    each chunk's ids are distinct rows and together they use every row."""
    by_rank = [cpu_inputs(pid, world_size, r) for r in range(world_size)]
    forward_sent = [i[-2] for i in by_rank]  # counts_received: chunk i goes to rank (r + i) % W
    forward_got = [i[-3] for i in by_rank]
    size = problem(pid).size("pkb")
    for r in range(world_size):
        for j in range(world_size):
            assert forward_got[r][j] == forward_sent[(r + j) % world_size][(world_size - j) % world_size]
        assert sum(forward_got[r]) == sum(forward_sent[r]) == size["ids"]
        ids = by_rank[r][1]
        for chunk in ids.split(forward_sent[r]):
            assert chunk.unique().numel() == chunk.numel(), "a chunk names a row once"
        assert torch.equal(ids.unique(), torch.arange(size["seed_size"])), "every row is used"
    if pid == 65:
        assert all(i[0].shape[0] == size["seed_size"] for i in by_rank)
    if world_size > 2:
        assert cpu_inputs(pid, world_size, 0, seed=2)[-2] != forward_sent[0]


@pytest.mark.parametrize("pid", [65, 66])
def test_request_counts_stay_within_the_rows(pid):
    """A peer's part never exceeds seed_size (its ids must be distinct rows), even where the random
    split would give it more; the parts still sum to the rows not kept."""
    module = problem(pid).module
    ctx = problem(pid).context(3, "pkb", rank=0, device="cpu")
    ctx.rand = lambda *shape, **kw: torch.tensor([1.5, 0.5], dtype=torch.float64)
    counts = module.request_counts(ctx, 1024, 512)
    assert counts == [341, 512, 171]


def test_69_scores_keep_their_order_under_float32_sigmoid():
    pos, neg, _ = cpu_inputs(69, 2, 1)
    assert pos.shape == (129,) and neg.shape == (129, 1000)
    assert not bool((neg == pos.unsqueeze(-1)).any()), "a tie would leave the rank to a sigmoid's rounding"
    grid = torch.unique(torch.cat([pos, neg.flatten()])).float()  # sorted bf16 values
    assert grid.abs().max() <= 6.0 and grid.abs().min() >= 2.0**-9
    # neighbouring logits stay apart by more than the ulp a float32 sigmoid's code paths differ by
    sig = torch.sigmoid(grid)
    ulp = torch.nextafter(sig[1:], torch.tensor(2.0)) - sig[1:]
    assert bool((sig.diff() >= 8 * ulp).all())


def test_69_ties_move_towards_zero():
    """The tie rule never decides: a negative drawn equal to its positive is one bf16 step nearer 0,
    and a logit nearer 0 than the floor goes to the floor (its sign kept)."""

    def below(v: float) -> float:  # the bf16 value one step nearer 0
        return (torch.tensor([v], dtype=torch.bfloat16).view(torch.int16) - 1).view(torch.bfloat16).item()

    floor = 2.0**-9
    ctx = problem(69).context(2, "pkb", rank=0, device="cpu")
    ctx.size = {"pos_base": 3, "negatives": 3}
    draws = iter(
        [
            torch.tensor([0.0, -0.25, 0.0]),  # plus 1.5: 1.5, 1.25, 1.5
            torch.tensor([[1.5, 0.5, 1.5], [1.25, -3.0, 1e-6], [0.0, -1e-6, 1.0]]),
        ]
    )
    ctx.randn = lambda *shape, dtype=None: next(draws)
    pos, neg, _ = problem(69).module.make_inputs(ctx)
    assert pos.tolist() == [1.5, 1.25, 1.5]
    assert neg.tolist() == [[below(1.5), 0.5, below(1.5)], [below(1.25), -3.0, floor], [floor, -floor, 1.0]]
    assert not bool((neg == pos.unsqueeze(-1)).any())


def test_72_fft_convolution_is_the_causal_direct_one():
    f64 = load(BY_PROBLEM / "072_float64.py", "c072_float64")
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 6, 40, generator=gen, dtype=torch.float64)
    h = torch.randn(3, 40, generator=gen, dtype=torch.float64)
    direct = torch.zeros_like(z)
    for t in range(40):
        for s in range(t + 1):
            direct[..., t] += h.repeat_interleave(2, dim=0)[:, s] * z[..., t - s]
    assert torch.allclose(f64.causal_conv(z, h, group_dim=2), direct, atol=1e-10)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_72_zigzag_order(world_size):
    """Rank r holds natural chunks r and 2W-1-r: the reference's chunk table and the float64
    candidate's position table agree with that definition."""
    f64 = load(BY_PROBLEM / "072_float64.py", "c072_float64")
    chunks = problem(72).module._zigzag_chunks(world_size, torch.device("cpu")).tolist()
    assert chunks == [c for r in range(world_size) for c in (r, 2 * world_size - 1 - r)]
    positions = f64._natural_positions(world_size, 4, True).view(-1, 2).tolist()
    assert [p[0] // 2 for p in positions] == chunks


# ---------------------------------------------------------------- fast: traffic against alternatives


def traffic(pid, world_size, preset="pkb"):
    return problem(pid).traffic(world_size, preset)


def ctx(pid, world_size, preset="pkb"):
    return problem(pid).context(world_size, preset)


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("preset", ["pkb", "large"])
def test_traffic_is_no_more_than_the_alternatives(world_size, preset):
    w = world_size

    # 39: Ulysses (4 (W-1)/W * hidden per local position) or gathering the hidden states ((W-1) *)
    s = ctx(39, w, preset).size
    per_position = s["batch"] * s["seq_local"] * s["hidden"] * 2
    t = traffic(39, w, preset)["nvlink_bytes"]
    assert t <= 4 * (w - 1) / w * per_position and t <= (w - 1) * per_position
    if w == 2:
        assert t < 4 * (w - 1) / w * per_position, "at W = 2 gathering beats the reference's schedule"

    # 65: the rows of the remote chunks (distinct within a chunk, so none can go once for two
    # slots); all-gathering every rank's rows instead would move (W-1) * seed_size rows
    s = ctx(65, w, preset).size
    remote_rows = (s["ids"] - s["ids"] // w) * s["features"] * 2
    assert traffic(65, w, preset)["nvlink_bytes"] == remote_rows
    assert remote_rows < (w - 1) * s["seed_size"] * s["features"] * 2

    # 66: the remote chunks' gradient rows, unsummed (a chunk's rows go to distinct output rows);
    # all-gathering the gradients would move (W-1) * ids rows
    s = ctx(66, w, preset).size
    unsummed = (s["ids"] - s["ids"] // w) * s["features"] * 4
    assert traffic(66, w, preset)["nvlink_bytes"] == unsummed < (w - 1) * s["ids"] * s["features"] * 4

    # 69: int64 ranks, or the scores themselves
    s = ctx(69, w, preset).size
    p_max = s["pos_base"] + min(w - 1, 2)
    t = traffic(69, w, preset)["nvlink_bytes"]
    assert t < (w - 1) * p_max * 8 < (w - 1) * p_max * s["negatives"] * 2

    # 72: the reference's four all-to-alls; a halo of filter_len - 1 positions for both chunks
    s = ctx(72, w, preset).size
    tensor = s["batch"] * s["num_groups"] * s["group_dim"] * s["seq_local"] * 2
    t = traffic(72, w, preset)["nvlink_bytes"]
    assert t == pytest.approx(0.5 * 4 * (w - 1) / w * tensor)
    channels = s["num_groups"] * s["group_dim"]
    halo_bytes = min(2 * (s["filter_len"] - 1), (w - 1) * s["seq_local"]) * s["batch"] * channels * 2
    assert t <= halo_bytes

    # 76: all-reduce of the output, or gathering inputs and kernel slices
    c = ctx(76, w, preset)
    if not problem(76).world_size_error(w, preset):
        out_voxels, _, x_local, w_local = problem(76).module._shapes(c)
        reduce_bytes = 2 * (w - 1) / w * c.size["channels_out"] * out_voxels * 2
        t = traffic(76, w, preset)["nvlink_bytes"]
        assert t <= reduce_bytes and t <= (w - 1) * (x_local + w_local) * 2

    # 87: the original's all-gather of every band's two edge rows
    s = ctx(87, w, preset).size
    row = s["channels"] * s["width"] * 2
    assert traffic(87, w, preset)["nvlink_bytes"] <= (w - 1) * 2 * row


# ---------------------------------------------------------------- integration: real ranks on CPU


def check(pid, path, world_size, trials=1):
    return service.check(
        RunRequest(
            problem=pid,
            path=path,
            world_size=world_size,
            device="cpu",
            trials=trials,
            timeout_s=600,
            sandbox="process",
        )
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("pid", "world_size"),
    [(38, 2), (38, 4), (65, 2), (65, 4), (66, 4), (69, 2), (69, 4), (72, 2), (72, 4), (76, 2), (87, 4)],
)
def test_original_style_candidate_passes(pid, world_size):
    r = check(pid, BY_PROBLEM / f"{pid:03d}_original_style.py", world_size)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
def test_39_original_style_fails_for_its_softmax_and_passes_once_fixed(tmp_path):
    """The stated difference: the original's softmax runs across heads. Its convention fails on
    nearly every element; the same file with the softmax over the keys passes."""
    original = BY_PROBLEM / "039_original_style.py"
    r = check(39, original, 2)
    assert r.verdict == "fail"
    for rank in r.ranks:
        assert rank.state == "wrong" and rank.rel_norm_error is not None and rank.rel_norm_error > 0.5
    fixed = tmp_path / "fixed.py"
    fixed.write_text(original.read_text().replace('ATTEND_OVER = "heads"', 'ATTEND_OVER = "sequence"'))
    assert check(39, fixed, 2).verdict == "pass"


@pytest.mark.integration
def test_69_bf16_probabilities_merge_ties_and_fail(tmp_path):
    bf16 = tmp_path / "bf16_sigmoid.py"
    text = (BY_PROBLEM / "069_original_style.py").read_text()
    bf16.write_text(text.replace("SIGMOID_DTYPE = torch.float32", "SIGMOID_DTYPE = torch.bfloat16"))
    r = check(69, bf16, 2, trials=2)
    assert r.verdict == "fail" and all(x.state == "wrong" for x in r.ranks)


# 65 and 66 without the exchange, or with chunk i sent to rank i instead of rank (r + i) % W (at
# W = 2 the counts are equal, so the wrong order is a wrong answer rather than a size mismatch; rank
# 0 sends as it should but receives rank 1's own chunk): problem id and body
GNN_MUTANTS = {
    "65_no_exchange": (65, "return local_features[seed_inverse_ids]"),
    "65_rank_order": (
        65,
        "out = torch.empty_like(local_features[seed_inverse_ids])\n"
        "    dist.all_to_all_single(out, local_features[seed_inverse_ids], counts_sent, counts_received)\n"
        "    return out",
    ),
    "66_no_exchange": (
        66,
        "return grad_output.new_zeros(seed_size, grad_output.shape[1]).index_add_(0, seed_inverse_ids, "
        "grad_output)",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("mutant", sorted(GNN_MUTANTS))
def test_65_66_fail_without_the_originals_exchange(tmp_path, mutant):
    pid, body = GNN_MUTANTS[mutant]
    args = [name for name, _ in CALLS[pid].params]
    path = tmp_path / f"{pid:03d}_{mutant}.py"
    path.write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        f"def solution({', '.join(args[:-1])}, group=None):\n    {body}\n"
    )
    r = check(pid, path, 2)
    assert r.verdict == "fail" and [rank.state for rank in r.ranks] == ["wrong", "wrong"], r.message


@pytest.mark.integration
@pytest.mark.parametrize(("pid", "world_size"), [(39, 4), (66, 4), (72, 2), (87, 2)])
def test_float64_candidate_passes(pid, world_size):
    """An independent float64 computation is within the tolerance of the reference."""
    r = check(pid, BY_PROBLEM / f"{pid:03d}_float64.py", world_size)
    assert r.verdict == "pass", r.message


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 4])
def test_72_example_passes(world_size):
    r = check(72, EXAMPLE_72, world_size)
    assert r.verdict == "pass", r.message


def _hyena_ranks(rank: int, world_size: int, store: str, size: dict, zigzag: bool) -> None:
    """One rank: the reference, the example (cut into channel chunks) and the float64 candidate on the
    same inputs of a size no preset has (filter groups of 4 channels, a batch of 2)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    try:
        p = load(ROOT / "problems" / "072_hyena_forward_cp.py", "p072")
        example = load(EXAMPLE_72, "e072")
        example.CHUNK_BYTES = 1  # as many chunks as allowed: the pipelined path
        f64 = load(BY_PROBLEM / "072_float64.py", "c072_float64")
        context = ProblemContext(rank=rank, world_size=world_size, size=size, dtype=torch.float32, seed=11)
        inputs = list(p.make_inputs(context))
        inputs[-1] = zigzag
        ref = p.solution(*inputs)
        assert example._chunk_groups(size["num_groups"] // world_size, 1 << 40) > 1
        for other in (example.solution(*inputs), f64.solution(*inputs)):
            assert other.shape == ref.shape == (size["batch"], size["seq_local"], size["num_groups"] * 4)
            diff = (other.double() - ref.double()).abs()
            assert bool((diff <= p.TOLERANCE["atol"] + p.TOLERANCE["rtol"] * ref.double().abs()).all())
            assert float(diff.norm() / ref.double().norm()) <= p.TOLERANCE["rel_norm"]
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize("zigzag", [True, False])
def test_72_example_in_chunks_with_filter_groups(tmp_path, zigzag):
    import torch.multiprocessing as mp

    size = {"batch": 2, "num_groups": 16, "group_dim": 4, "seq_local": 64, "filter_len": 100}
    world_size = 2
    mp.start_processes(
        _hyena_ranks,
        args=(world_size, str(tmp_path / "store"), size, zigzag),
        nprocs=world_size,
        start_method="spawn",
    )
