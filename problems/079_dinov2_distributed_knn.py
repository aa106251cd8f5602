"""k-NN retrieval over a sharded train set: each rank's queries against every rank's train features.

DINOv2's k-NN evaluation: the train set's features are split across ranks (rank r holds
train_features_rank_T [D, N], transposed, and their class labels train_labels_rank int64 [1, N]),
and so are the test queries (test_features_rank [Q, D]), bf16. For each of its queries, every rank
returns the max_k = k train rows of all ranks with the largest similarity (the dot product of the
query and the row): their similarities, float32 [Q, k] in descending order, and their labels, int64
[Q, k]. Labels are judged exactly, similarities too (they are exact, below).

Inputs without ties, with exact similarities: the features are small integers times powers of two.
A query's first D - 3 entries are -1, 0 or 1; a train row has s of its first D - 3 entries set to
+-1/8 (the rest 0), and its last three entries carry a number unique to the row, g < 2^17 (a random
permutation of all ranks' rows), as g = a 2^16 + b 2^8 + c with entries a, b, c times 2^-20 against
the query's 2^16, 2^8 and 1. So a similarity is m / 8 + g 2^-20 with |m| <= s < 128: a multiple of
2^-20 below 16 in magnitude, exact in bf16 inputs and in every float32 sum of their products in any
order; no two rows of any query score the same (g breaks every tie of m), so the top-k set and its
order are unique. A bf16 similarity would not be: rounding to bf16 merges the values and leaves the
labels to the top-k's tie order.

The reference all-gathers the queries, computes every rank's queries against its own rows in one
GEMM, keeps each query's k best with their labels, sends them to the query's owner with one
all-to-all, and merges the W k candidates with a second top-k.

Source: DINOv2 k-NN evaluation (facebookresearch/dinov2, `eval/knn.py`; ParallelKernelBench problem
79). The call is the original's: (test_features_rank, train_features_rank_T, train_labels_rank,
max_k, None); the pkb size is the original's at world size 8 (Q = 32, N = 2048, D = 384, k = 200).

Differences from the original: the similarities are float32, from float32 sums of the bf16 products
(the original's bf16 GEMM rounds them to bf16, which ties many of them, so its labels are the
top-k's tie order); the features are the integer codes above instead of normalised Gaussian
vectors, so that no ties remain and every exact summation order gives the same result; the labels
are random in 0 .. 999 instead of the row's index mod 1000; W N is at most 2^17 (the unique
numbers' range). The original's reference broadcasts each rank's queries in turn and gathers the
candidates to their owner, 2 W collectives; this one uses an all-gather and an all-to-all. N is the
original's at world size 8 only (its N is 16384 / W: 8192 at W = 2, 4096 at W = 4).
"""

import torch
import torch.distributed as dist

ID = 79
NAME = "dinov2_distributed_knn"
CATEGORY = "retrieval"
SOURCE = "DINOv2 k-NN evaluation (facebookresearch/dinov2)"
SUMMARY = "Top-200 train rows (float32 similarity, int64 label) per query over train features split by rank."
DTYPE = "bfloat16"
WORLD_SIZES = "any world size >= 2 with W * train <= 2^17"
SIZES = {
    # queries Q and train rows N per rank, feature dim D (3 of it the row's number), k, s: nonzeros
    # of a train row's code
    "pkb": {"queries": 32, "train": 2048, "dim": 384, "k": 200, "nonzeros": 64},
    # estimate, not yet measured: 2 W Q D N = 0.55 TFLOP per rank at W = 4 (0.7 ms at 790 TFLOP/s)
    # after an all-gather of 8 MiB of queries per rank, then a top-200 of 16384 per query
    "large": {"queries": 4096, "train": 16384, "dim": 1024, "k": 200, "nonzeros": 64},
}
# Exact: every similarity is a multiple of 2^-20 below 16 (float32 sums of the products are exact in
# any order) and no two tie, so the labels and the similarities have one right answer.
TOLERANCE = {"atol": 0.0, "rtol": 0.0, "rel_norm": 0.0}
ID_BITS = 17
ID_WEIGHTS = (2.0**16, 2.0**8, 1.0)  # the query's last three entries
TRAIN_SCALE = 2.0**-20  # the train row's number entries; its code entries are 2^17 of these (1/8)


def check_world_size(world_size, size):
    """None when the world size works for this size preset, else the reason it does not."""
    if world_size < 2:
        return "needs at least 2 ranks"
    if world_size * size["train"] > 2**ID_BITS:
        return f"world size {world_size} times {size['train']} train rows exceeds 2^{ID_BITS} row numbers"
    return None


def unseen_size(draw, world_size):
    """A size each check also runs at, never a preset's (pkb_mcp/runs/unseen.py): any query and train
    counts (train in 64s), feature dims in 64s, any k and code weight below 128 (similarities exact)."""
    return {
        "queries": draw("queries", 8, 64),
        "train": draw("train", 256, 4096, 64),
        "dim": draw("dim", 128, 768, 64),
        "k": draw("k", 10, 256),
        "nonzeros": draw("nonzeros", 8, 120),
    }


def make_inputs(ctx):
    """Ternary queries with the number weights; train codes with s entries +-1/8 and the row's
    number; random labels 0 .. 999; k; group None."""
    s = ctx.size
    q, n, d, w = s["queries"], s["train"], s["dim"], ctx.world_size
    labels = ctx.randint(0, 1000, 1, n)
    if ctx.is_meta:
        queries = torch.empty(q, d, device="meta")
        train = torch.empty(d, n, device="meta")
    else:
        code = d - len(ID_WEIGHTS)
        weights = torch.tensor(ID_WEIGHTS, device=ctx.device).expand(q, -1)
        queries = torch.cat([ctx.randint(-1, 2, q, code).float(), weights], 1)
        places = ctx.rand(n, code, dtype=torch.float32).topk(s["nonzeros"], dim=1).indices
        signs = ctx.randint(0, 2, n, s["nonzeros"]).float().mul_(2).sub_(1)
        rows = torch.zeros(n, code, device=ctx.device).scatter_(1, places, signs / 8)
        number = ctx.rand(w * n, dtype=torch.float32, shared=True).argsort()[
            ctx.rank * n : (ctx.rank + 1) * n
        ]
        digits = torch.stack([number >> 16, (number >> 8) & 255, number & 255], 1).float() * TRAIN_SCALE
        train = torch.cat([rows, digits], 1).t()
    return queries.to(ctx.dtype), train.to(ctx.dtype).contiguous(), labels, s["k"], None


def _similarities(queries, train_t):
    """float32 [rows of queries, N]: float32 sums of the bf16 products."""
    if queries.is_cuda:
        return torch.mm(queries, train_t, out_dtype=torch.float32)
    return queries.float() @ train_t.float()


@torch.no_grad()
def solution(test_features_rank, train_features_rank_T, train_labels_rank, max_k, group=None):
    w = dist.get_world_size(group)
    q, d = test_features_rank.shape
    queries = test_features_rank.new_empty(w * q, d)
    dist.all_gather_into_tensor(queries, test_features_rank.contiguous(), group=group)
    top_sims, rows = _similarities(queries, train_features_rank_T).topk(max_k, dim=1)
    top_labels = train_labels_rank[0][rows]
    # row block o of the candidates belongs to rank o's queries
    sims = torch.empty_like(top_sims)
    labels = torch.empty_like(top_labels)
    dist.all_to_all_single(sims, top_sims, group=group)
    dist.all_to_all_single(labels, top_labels, group=group)
    sims = sims.view(w, q, max_k).transpose(0, 1).reshape(q, w * max_k)
    labels = labels.view(w, q, max_k).transpose(0, 1).reshape(q, w * max_k)
    best, picked = sims.topk(max_k, dim=1)
    return best, labels.gather(1, picked)


def traffic(ctx):
    """Per GPU, the least of two schedules, plus the results: the owner's queries to every peer
    ((W-1) Q D bf16, the reference's all-gather) or every peer's train rows and labels to every owner
    ((W-1) N (D bf16 + a 2-byte label)); then, on average, (W-1)/W of each query's k winners lie on
    other ranks and must reach its owner (a float32 similarity and a 2-byte label each). 2 rounds.
    HBM: the train shard and all queries read once, the outputs written. FLOPs: the GEMM of all W Q
    queries against the rank's N rows."""
    w, s = ctx.world_size, ctx.size
    q, n, d, k = s["queries"], s["train"], s["dim"], s["k"]
    send_inputs = (w - 1) * min(q * d * 2, n * (d * 2 + 2))
    winners = (w - 1) / w * q * k * (4 + 2)
    return {
        "nvlink_bytes": send_inputs + winners,
        "hbm_bytes": d * n * 2 + n * 8 + w * q * d * 2 + q * k * (4 + 8),
        "flops": 2 * w * q * d * n,
        "rounds": 2,
    }


# How a file written for the original benchmark is called (harness/convention.py): this problem
# takes the original's arguments, so the call is ours.
ORIGINAL = {
    "signature": (
        "solution(test_features_rank: torch.Tensor, train_features_rank_T: torch.Tensor, "
        "train_labels_rank: torch.Tensor, max_k: int, group: Optional[dist.ProcessGroup] = None) "
        "-> Tuple[torch.Tensor, torch.Tensor]"
    ),
    "args": lambda inputs, env: inputs,
    "differences": (
        "the call is the original's; the similarities are float32 sums of the bf16 products (the "
        "original returns them rounded to bf16, which ties many of them and leaves the labels to the "
        "top-k's tie order: a file that returns bf16 similarities fails on their dtype); the features "
        "are integer codes with a number unique to each train row, so that no similarities tie and all "
        "are exact; the labels are random in 0 .. 999; W N is at most 2^17. N is the original's at "
        "world size 8 only (its N is 16384 / W)."
    ),
}
