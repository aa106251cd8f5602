#!/usr/bin/env bash
# Issue 22: the profile tool on GPUs (docs/measurement.md, "Profile"), in one device call of about 5 minutes.
# On the device machine, from the repository root, with .gpu carried:
#     source .gpu/setup.sh > $OUT/setup.log 2>&1; OUT=$OUT bash bench/scripts/profile_gpu.sh
# World size $WS (else 2). For each profile: NAME.json (the result), NAME.txt (its text, with the
# command's wall time), NAME.err (progress and logs); the traces and timelines go into one tar
# (profiles.tgz), since the device tool returns a limited number of files.
set -uo pipefail
OUT=${OUT:-gpu-out}
WS=${WS:-2}
mkdir -p "$OUT"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpus.txt" 2>&1
command -v ncu > "$OUT/ncu.txt" 2>&1
grep -i profiling /proc/driver/nvidia/params >> "$OUT/ncu.txt" 2>&1

prof() {  # prof NAME PROBLEM FILE SIZE
  local t0 t1
  t0=$(date +%s%N)
  timeout 280 python3 -m pkb_mcp profile "$2" "$3" --world-size "$WS" --size "$4" --device cuda \
    --json --out "$OUT/profiles/$1" > "$OUT/$1.json" 2> "$OUT/$1.err"
  local rc=$?
  t1=$(date +%s%N)
  {
    echo "pkb profile $2 $3 --world-size $WS --size $4 --device cuda: exit $rc, $(( (t1 - t0) / 1000000 )) ms wall"
    python3 - "$OUT/$1.json" <<'PY'
import sys
from pkb_mcp.profiling import text
from pkb_mcp.profiling.profile import ProfileResult
print(text.profile(ProfileResult.model_validate_json(open(sys.argv[1]).read())))
PY
  } > "$OUT/$1.txt" 2>&1
  cat "$OUT/$1.txt"
}

# problem 12: the reference (NCCL all-gather, then the GEMM: no overlap expected), and examples/012
# (copy-engine pulls on a side stream under the block GEMMs: overlap above zero expected at large)
prof p12_ref_large 12 problems/012_allgather_gemm.py large
prof p12_ex012_large 12 examples/012_allgather_gemm_overlap.py large
prof p12_ex012_pkb 12 examples/012_allgather_gemm_overlap.py pkb
# a symmetric-memory example: problem 1's all-reduce through torch symmetric memory
prof p1_symm_pkb 1 examples/001_allreduce_symm_mem.py pkb
# the MCP tool's wall time, through a server in this process (cold: no warm sandboxes)
timeout 280 python3 bench/scripts/profile_tool_wall.py --world-size "$WS" > "$OUT/tool_wall.txt" 2>&1
cat "$OUT/tool_wall.txt"
tar czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
