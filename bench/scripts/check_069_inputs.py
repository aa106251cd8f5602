"""Problem 69's inputs on a device: no negative equal to its positive, every |logit| within the floor
and the limit, and the rank counted by a float32 sigmoid equal to the rank counted on the logits.
Beside them, inputs drawn the earlier way (clamped N(0, 1) logits, ties left in), for comparison.

Needs no second GPU: it draws each rank's inputs on one device and counts without collectives.

    python3 bench/scripts/check_069_inputs.py --device cuda --out rows.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pkb_mcp.problems import resolve  # noqa: E402


def miscounted(pos: torch.Tensor, neg: torch.Tensor) -> int:
    """Positives whose rank differs between the logits and a float32 sigmoid of them."""
    on_logits = (neg >= pos.unsqueeze(-1)).sum(-1)
    on_probabilities = (torch.sigmoid(neg.float()) >= torch.sigmoid(pos.float()).unsqueeze(-1)).sum(-1)
    return int((on_logits != on_probabilities).sum())


def earlier_inputs(shape: torch.Size, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    pos = torch.randn(shape[:1], generator=gen, device=device).add_(1.5).clamp_(-6, 6).to(torch.bfloat16)
    neg = torch.randn(shape, generator=gen, device=device).clamp_(-6, 6).to(torch.bfloat16)
    return pos, neg


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", nargs="+", default=["pkb", "large"])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    problem = resolve(69)
    rows = []
    for size in args.sizes:
        for rank in (0, 1):
            for seed in range(1, args.seeds + 1):
                ctx = problem.context(2, size, rank=rank, device=args.device)
                ctx.seed = seed
                sync(args.device)
                t0 = time.perf_counter()
                pos, neg, _ = problem.module.make_inputs(ctx)
                sync(args.device)
                took_ms = (time.perf_counter() - t0) * 1e3
                magnitudes = torch.cat([pos.abs().float(), neg.abs().float().flatten()])
                old_pos, old_neg = earlier_inputs(neg.shape, seed, args.device)
                row = {
                    "size": size,
                    "rank": rank,
                    "seed": seed,
                    "negatives_shape": list(neg.shape),
                    "make_inputs_ms": round(took_ms, 1),
                    "ties": int((neg == pos.unsqueeze(-1)).sum()),
                    "least_abs_logit": float(magnitudes.min()),
                    "largest_abs_logit": float(magnitudes.max()),
                    "miscounted_by_float32_sigmoid": miscounted(pos, neg),
                    "earlier_ties": int((old_neg == old_pos.unsqueeze(-1)).sum()),
                    "earlier_miscounted_by_float32_sigmoid": miscounted(old_pos, old_neg),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                del pos, neg, magnitudes, old_pos, old_neg
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
