#!/usr/bin/env bash
# What is still to be measured on GPUs, in parts that each fit one device call (<= 10 minutes).
# On the device machine, from the repository root, with .gpu carried:
#     source .gpu/setup.sh && bash docs/scripts/gpu_batch.sh PART [PART ...]
# Every part writes its JSONL and logs under $OUT (default ./gpu-out), then prints a summary.
#   warm       issue 5: why checks ran cold in run E (server log at info level), then the warm
#              run_correctness turnaround of problem 1 (5 trials, 4 GPUs, Docker)
#   refs-pkb   issues 5, 7: every reference against itself at world size 4, size pkb (fidelity call 1)
#   refs-large issue 7: the same at size large
#   fidelity   issue 5: fidelity calls 2 and 3 (every reference at pkb, two more separate calls)
#   examples2  issues 2, 4: the examples checked and benchmarked at world size 2 (and 018 at large)
#   examples4  issue 4: the examples at world size 4 in containers
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
git status --short > "$OUT/status.txt" 2>/dev/null
ALL=$(python3 -c "from pkb_mcp import problems; print(','.join(str(i) for i in sorted(problems.suite())))")
report() { python3 docs/scripts/gpu_report.py "$@"; }

for part in "$@"; do
  case "$part" in
    warm)
      timeout 300 python3 docs/scripts/turnaround.py --out "$OUT/warm.jsonl" --parts check \
        --check-repeats 7 --think-s 8 --log "$OUT/warm_log.jsonl" | tail -3
      grep -E '"warm\.(take|died|expired|start_failed)"' "$OUT/warm_log.jsonl" | cut -c1-600 | head -20 ;;
    refs-pkb)
      timeout 590 python3 docs/scripts/gpu_report.py --out "$OUT/refs_pkb.jsonl" --world-sizes 4 \
        --parts refs --sizes pkb --problems "$ALL" --no-refs-check --warm > "$OUT/refs_pkb.log" 2>&1
      tail -60 "$OUT/refs_pkb.log" ;;
    refs-large)
      timeout 590 python3 docs/scripts/gpu_report.py --out "$OUT/refs_large.jsonl" --world-sizes 4 \
        --parts refs --sizes large --problems "$ALL" --no-refs-check --warm > "$OUT/refs_large.log" 2>&1
      tail -60 "$OUT/refs_large.log" ;;
    fidelity)
      for call in 2 3; do
        timeout 290 python3 docs/scripts/gpu_report.py --out "$OUT/fidelity_$call.jsonl" --world-sizes 4 \
          --parts refs --sizes pkb --problems "$ALL" --no-refs-check --warm > "$OUT/fidelity_$call.log" 2>&1
        tail -45 "$OUT/fidelity_$call.log"
      done ;;
    examples2)
      timeout 590 python3 docs/scripts/gpu_report.py --out "$OUT/examples2.jsonl" --world-sizes 2 \
        --parts examples > "$OUT/examples2.log" 2>&1
      tail -30 "$OUT/examples2.log" ;;
    examples4)
      timeout 590 python3 docs/scripts/gpu_report.py --out "$OUT/examples4.jsonl" --world-sizes 4 \
        --parts examples > "$OUT/examples4.log" 2>&1
      tail -30 "$OUT/examples4.log" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
