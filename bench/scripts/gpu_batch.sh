#!/usr/bin/env bash
# What is still to be measured on GPUs, in parts that each fit one device call (<= 10 minutes).
# On the device machine, from the repository root, with .gpu carried:
#     source .gpu/setup.sh && bash bench/scripts/gpu_batch.sh PART [PART ...]
# Every part writes its JSONL and logs under $OUT (default ./gpu-out), then prints a summary.
# DEVICE=cpu makes the reference parts a dry run on a machine without GPUs.
# commit.txt and status.txt describe the .git that travelled, which can be older than the working
# tree that did (the device tool sends the session's checkout): record the commit from your own log.
#   warm       issue 5: why checks ran cold in run E (server log at info level), then the warm
#              run_correctness turnaround of problem 1 (5 trials, 4 GPUs, Docker); warm2: on 2 GPUs
#   refs-pkb   issues 5, 7: every reference against itself at world size 4, size pkb (fidelity call 1)
#   refs-w2    issue 2: every reference against itself at world size 2, size pkb
#   refs-large-a, refs-large-b   issue 7: the same at size large, first and second half of the suite
#   fidelity2, fidelity3         issue 5: fidelity calls 2 and 3 (every reference at pkb again)
#   examples2  issues 2, 4: the examples checked and benchmarked at world size 2 (and 018 at large)
#   examples4  issue 4: the examples at world size 4 in containers
#   launches-noisy issue 5, in one call: the references whose launches spread most in run G, benchmarked
#              against themselves with $LAUNCHES (else 2) launches per side, reference and candidate
#              alternating, twice; world size $WS, else 4
#   bench12    issue 5: the benchmark of examples/012 on problem 12, three calls, with $LAUNCHES (else 1)
#              launches per side (target: <= 20 s each); world size $WS, else 4
#   launches-a, launches-b   issue 5: every reference against itself at size pkb, with $LAUNCHES (else 4) launches
#              per side, first and second half of the suite (one fidelity call is both halves; $TAG,
#              else 1, names it); world size $WS, else 4
#   memo17     issue 17: the memoizers of problem 1 (plain, burning GPU time on a hit) and the honest
#              control, at pkb and large, $REPEATS (else 2) times each; world size $WS, else 2
#   refs17-a, refs17-b   issue 17: every reference against itself at size pkb (replay advantages of
#              honest code, self-speedups), first and second half of the suite; world size $WS, else 2
#   refs-new   the workloads added or reworked in issues 17, 20 and 21 against themselves ($NEW, $SIZE)
#   refs17-large         issue 17: the references whose work changed (23, 86) and problem 1 at large
#   pytest17   issue 17: the GPU tests (every reference at a world size its rule allows, the examples,
#              the GPU hacks including the memoizers); 2 GPUs
#   pytest-par the same tests less the timed ones, $N (else 4) at a time (pytest-xdist, ranks not
#              pinned): verdicts only, so sharing the GPUs changes nothing they assert
#   pytest-timed the GPU hacks whose verdict rests on timing (memoizers, honest code not flagged), alone
#   examples-new issue 29: examples 072 and 082 checked and benchmarked at both sizes; world size $WS, else 2
#   profile12  issue 29: the MCP profile tool on examples/012 at large (profile_tool_wall.py) and
#              `pkb profile` of it at pkb; world size $WS, else 2
#   side-by-side-a .. side-by-side-d   issue 28 item 7: the original harness (run_local.py, from a copy
#              of the original in ${ORIGINAL:-.gpu/pkb-original}: `cp -r ../shared/pkb-original .gpu/`
#              before the call) and `pkb check --variant original` side by side, verdict agreement
#              (bench/scripts/side_by_side.py), over a quarter each of the original-format files:
#              tests/candidates/original/, examples/original/ (013 a C++ build failure) and the custom
#              CUDA files (tests/candidates/original_helper_cuda.py as 001_allreduce_cuda.py, examples/001_*);
#              $TRIALS (else 1) trials a side; world size $WS, else 2
#   build-speed issue 32: bench/scripts/build_speed.py (first build, kernel-only edit, cached re-check,
#              plain check, a batch of $FILES (else 10) extension files through pkb eval); world size $WS, else 2;
#              $STAGES (else all five) and $REPEATS (else 5) pass through; NO_WARM=1: the batch without
#              warm sandboxes; SERVER=1: warm sandboxes kept as `pkb serve` does (a build launch takes
#              a warm tool sandbox); $SOLUTION: another solution than example 001 (its kernel opened by
#              CUDA_SRC = r""", as tests/candidates/original_helper_cuda.py's is)
#   warm-ext   issue 32 items 2 and 3: warm run_correctness through the MCP server (turnaround.py, a
#              warm pool of PKB_WARM_PER_SHAPE) of $FILES_CHECKED, else problem 1's reference, a plain
#              solution with a C++ extension and one with a CUDA extension (cached after their first
#              check), and example 001's own kernel; $REPEATS (else 6) each, $THINK (else 8) s apart;
#              the server's log keeps each launch's stages and whether it started warm, and
#              bench/scripts/launch_steps.py sums up where the warm launches' time went; $TAG names it
#   nvcc-phases issue 32: where a CUDA unit's build time goes (nvcc -time, per phase) and the same unit
#              through harness/nvcc.py (host and device front ends at once), side by side, $REPEATS
#              (else 2) times: bench/scripts/nvcc_phases.py on example 001's kernel, on the node (no sandbox);
#              $NVCC_FILE: another solution's kernel, the string $NVCC_VARIABLE (else CUDA_SRC); $TAG names it
#   nvcc-at-once issue 32: what a wave of builds does to each: $AT_ONCE (else 1,4,8) copies of the CUDA unit
#              of $NVCC_FILE (else example 001) compiled through harness/nvcc.py at once, all but the first
#              at niceness $NICE (else 0): bench/scripts/nvcc_phases.py --at-once, on the node (no sandbox)
#   gpu-step   issue 32: what a warm sandbox's GPU step costs with 1-6 opened at once, and whether its parts
#              disturb a benchmark timed beside them (bench/scripts/gpu_step.py); $REPEATS (else 2),
#              $COUNTS (else 1,2,4,6); DOCKER=1: each pair in a container made as the sandbox's are;
#              ANATOMY_ONLY=1: no interference part; $DISTURBANCES (else none,context,group,step);
#              NCCL_LOG=1: NCCL's set-up lines per rank; $TAG
#   ray-batch  issue 32 item 4: $FILES (else 8) copies of $SOLUTION (else the original helper), each with a
#              kernel of its own, through `pkb eval` on this node, then through `pkb eval --ray auto` on a
#              one-node Ray cluster of this node's GPUs (`ray start --head`), each with an empty cache;
#              Ray from the wheels in $RAY_WHEELS (the device has no registry); ray_batch.jsonl
#   nvlink-probe issue 34 (docs/nvlink-counters.md), before the profiles: ncu's path, version and metric
#              names of interest (nvl, peer, aperture, tma), the driver's profiling setting, NVML's NVLink
#              counters around peer copies of known size (bench/scripts/nvlink_probe.py), and ncu's CSV of
#              one local kernel with the profile's metric set; into $OUT/nvlink/
#   nvlink-oneshot, nvlink-copy, nvlink-ref   issue 34: `pkb profile` of problem 1 in the process sandbox
#              (its counter launches need it) with the candidate examples/001_allreduce_cuda_oneshot.py (SM
#              loads over NVLink), examples/001_allreduce_copy_engine.py (copy engine) or the reference
#              itself (NCCL), at size pkb then large, --timeout $NVTIMEOUT (else 120: the counter launches'
#              deadline too); each: NAME.json (the result), NAME.txt (its text), NAME.err, NAME.tgz (trace,
#              timeline); world size $WS, else 2. The result's `method` says what counted the bytes.
#   nvlink-pytest issue 34's acceptance tests (tests/test_profile.py -k nvlink: bytes within 10% of the
#              traffic model, the mechanism where ncu counted) on 2 GPUs
# LIMIT (seconds) caps the refs and pytest parts. DEADLINE (epoch seconds) caps every part's limit at
# the time left, and skips a part when less than a minute is left; PACK (a path outside $OUT) is rewritten as a tar of $OUT after each part, so a
# device call stopped at its limit still returns what finished.
# GPU launches pin each rank to CPU cores of its own unless PKB_PIN_CPUS=0 (sandbox/cpus.py).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
git status --short > "$OUT/status.txt" 2>/dev/null
ALL=$(python3 -c "from pkb_mcp import problems; print(','.join(str(i) for i in sorted(problems.suite())))")
HALF_A=$(echo "$ALL" | tr ',' '\n' | awk 'NR % 2 == 1' | paste -sd,)
HALF_B=$(echo "$ALL" | tr ',' '\n' | awk 'NR % 2 == 0' | paste -sd,)
# every problem with a self-benchmark outside 1.00 +- 3% or a launch-to-launch spread of 0.9% or more in run F
NOISY=16,17,18,19,21,22,23,40,41,42,43,45,47,53,73,86
# every problem whose six launches (three calls, two sides) spread 1.0% or more in run G, but problem 10
NOISY_G=12,15,17,23,40,41,42,43,45,52,86
limit() {  # limit SECONDS: SECONDS, or the time left before $DEADLINE where that is less (at least 1:
  local want=$1 left   # `timeout 0` would mean no limit at all)
  if [ -n "${DEADLINE:-}" ]; then
    left=$(( DEADLINE - $(date +%s) ))
    [ "$left" -lt "$want" ] && want=$left
  fi
  [ "$want" -lt 1 ] && want=1
  echo "$want"
}
refs() {  # refs NAME SIZE PROBLEMS [WORLD_SIZE]: references against themselves, $LAUNCHES launches a side
  timeout "$(limit "${LIMIT:-590}")" python3 bench/scripts/gpu_report.py --out "$OUT/$1.jsonl" --world-sizes "${4:-${WS:-4}}" --parts refs \
    --sizes "$2" --problems "$3" --no-refs-check --warm --launches "${LAUNCHES:-1}" \
    --device "${DEVICE:-cuda}" > "$OUT/$1.log" 2>&1
  tail -45 "$OUT/$1.log"
}
examples() {  # examples WORLD_SIZE [NAME FILTER]
  timeout "$(limit 590)" python3 bench/scripts/gpu_report.py --out "$OUT/examples$1${2:-}.jsonl" --world-sizes "$1" \
    --parts examples ${3:+--example "$3"} > "$OUT/examples$1${2:-}.log" 2>&1
  tail -30 "$OUT/examples$1${2:-}.log"
}
TIMED="memoized or honest"
side_by_side() {  # side_by_side QUARTER (1-4): every fourth original-format file, from the QUARTER-th
  local files=/tmp/side-by-side-cuda name="side_by_side_w${WS:-2}_$1"
  mkdir -p "$files"  # the custom-CUDA files under the names the original's launcher needs
  cp tests/candidates/original_helper_cuda.py "$files/001_allreduce_cuda.py"
  cp examples/001_allreduce_cuda_oneshot.py examples/001_allreduce_symm_mem.py "$files/"
  ls tests/candidates/original/[0-9]*.py examples/original/[0-9]*.py "$files"/[0-9]*.py \
    | awk -v q="$1" 'NR % 4 == q % 4' > "/tmp/$name.files"
  timeout "$(limit 590)" python3 bench/scripts/side_by_side.py $(cat "/tmp/$name.files") \
    --world-size "${WS:-2}" --device "${DEVICE:-cuda}" --trials "${TRIALS:-1}" --timeout 240 \
    --original "${ORIGINAL:-.gpu/pkb-original}" --json "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1
  tail -40 "$OUT/$name.log"
}  # the GPU hacks whose verdict rests on timing: never run beside other work
ray_batch() {  # issue 32 item 4: one node against a one-node Ray cluster, the same files
  local dir=/tmp/ray-batch n=${FILES:-8} src=${SOLUTION:-tests/candidates/original_helper_cuda.py} where
  python3 -m pip install -q --no-index --find-links "$RAY_WHEELS" ray > "$OUT/ray_install.log" 2>&1
  # on 2026-11-28 no engine answered in the calls after the one that started it: start it again where its
  # socket is left but nothing answers, and keep its log
  if ! python3 -c "import docker; docker.from_env(timeout=5).ping()" 2> "$OUT/ray_docker.log"; then
    cp /tmp/dockerd.log "$OUT/ray_dockerd_before.log" 2>/dev/null
    [ -f /tmp/dk.pid ] && kill "$(cat /tmp/dk.pid)" 2>/dev/null; sleep 2; rm -f /tmp/dk.sock
    source .gpu/setup.sh >> "$OUT/ray_docker.log" 2>&1
  fi
  rm -rf "$dir" && mkdir -p "$dir/files"
  for i in $(seq 0 $((n - 1))); do  # a kernel of its own each (as build_speed.py's batch)
    sed "0,/CUDA_SRC = r\"\"\"/s//CUDA_SRC = r\"\"\"\/\/ file $i\n/" "$src" > "$dir/files/001_allreduce_kernel$i.py"
  done
  for where in node ray; do
    export PKB_CACHE_DIR=$dir/cache-$where
    local extra=()
    if [ "$where" = ray ]; then
      ray start --head --num-gpus "$(nvidia-smi -L | wc -l)" --disable-usage-stats > "$OUT/ray_start.log" 2>&1
      extra=(--ray auto)
    fi
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout "$(limit 280)" python3 -m pkb_mcp eval "$dir/files" --device cuda --world-size "${WS:-2}" --trials 1 \
      --timeout 120 --sandbox docker --json --store "$dir/$where.sqlite" --out "$dir/out-$where" "${extra[@]}" \
      > "$OUT/ray_batch_$where.json" 2> "$OUT/ray_batch_$where.err"
    rc=$?
    t1=$(date +%s.%N)
    python3 -c "import json, sys; r = json.load(open(sys.argv[1])) if sys.argv[4] == '0' else {'results': []}
w = float(sys.argv[3]) - float(sys.argv[2]); res = r['results']
print(json.dumps({'where': sys.argv[5], 'exit': int(sys.argv[4]), 'files': len(res), 'wall_s': round(w, 1),
  'files_per_min': round(60 * len(res) / w, 2), 'outcomes': sorted({x['outcome'] for x in res}),
  'speedups': sorted(round(x['speedup'], 4) for x in res if x.get('speedup'))}))" \
      "$OUT/ray_batch_$where.json" "$t0" "$t1" "$rc" "$where" | tee -a "$OUT/ray_batch.jsonl"
    [ "$where" = ray ] && ray stop --force > "$OUT/ray_stop.log" 2>&1
  done
  unset PKB_CACHE_DIR
}
nvlink_profile() {  # nvlink_profile NAME CANDIDATE SIZE: problem 1's profile, counters wherever they run
  local dir="$OUT/nvlink" rc
  mkdir -p "$dir"
  timeout "$(limit 290)" python3 -m pkb_mcp profile 1 "$2" --world-size "${WS:-2}" --size "$3" --device cuda \
    --sandbox process --timeout "${NVTIMEOUT:-120}" --json --out "$dir/$1" > "$dir/$1.json" 2> "$dir/$1.err"
  rc=$?
  echo "pkb profile 1 $2 --size $3: exit $rc at $(date -u +%FT%TZ)" >> "$dir/$1.err"
  [ -s "$dir/$1.json" ] || { tail -3 "$dir/$1.err"; return 0; }
  python3 - "$dir/$1.json" > "$dir/$1.txt" 2>&1 <<'PY'
import sys
from pkb_mcp.profiling import text
from pkb_mcp.profiling.profile import ProfileResult
print(text.profile(ProfileResult.model_validate_json(open(sys.argv[1]).read())))
PY
  [ -d "$dir/$1" ] && tar czf "$dir/$1.tgz" -C "$dir" "$1" && rm -rf "${dir:?}/$1"
  head -70 "$dir/$1.txt"
}
nvlink_probe() {
  local dir="$OUT/nvlink" ncu metrics
  mkdir -p "$dir"
  ncu=$(python3 -c "from harness.counters import find_ncu; print(find_ncu() or '')")
  metrics=$(python3 -c "from pkb_mcp.profiling.nvlink import NCU_METRICS; print(','.join(NCU_METRICS))")
  {
    echo "ncu: ${ncu:-not found}"; [ -n "$ncu" ] && "$ncu" --version
    grep -i profiling /proc/driver/nvidia/params; grep CapEff /proc/self/status
    nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi nvlink -s -i 0 | head -8
  } > "$dir/env.txt" 2>&1
  cat "$dir/env.txt"
  timeout "$(limit 120)" python3 bench/scripts/nvlink_probe.py > "$dir/nvml_probe.jsonl" 2> "$dir/nvml_probe.err"
  cat "$dir/nvml_probe.jsonl"; tail -5 "$dir/nvml_probe.err"
  [ -n "$ncu" ] || return 0
  timeout "$(limit 120)" "$ncu" --query-metrics > "$dir/query_metrics.txt" 2>&1
  grep -iE 'nvl|peer|aperture|tma' "$dir/query_metrics.txt" | head -120 > "$dir/metrics_of_interest.txt"
  wc -l "$dir/query_metrics.txt" "$dir/metrics_of_interest.txt"
  timeout "$(limit 180)" "$ncu" --clock-control none --cache-control none --replay-mode kernel \
    --csv --page raw --print-units base --metrics "$metrics" --log-file "$dir/ncu_local.csv" \
    python3 bench/scripts/nvlink_probe.py --local > "$dir/ncu_local.out" 2>&1
  echo "ncu on one local kernel: exit $?"; head -c 3000 "$dir/ncu_local.csv"
}

for part in "$@"; do
  if [ "$(limit 60)" -lt 60 ]; then
    echo "part $part skipped: less than a minute before DEADLINE" | tee -a "$OUT/skipped.txt"
    continue
  fi
  echo "part $part: start $(date -u +%FT%TZ)" >> "$OUT/parts.txt"
  case "$part" in
    warm|warm2)
      ws=4; [ "$part" = warm2 ] && ws=2
      timeout 300 python3 bench/scripts/turnaround.py --out "$OUT/$part.jsonl" --parts check --world-size $ws \
        --check-repeats 7 --think-s 8 --log "$OUT/${part}_log.jsonl" | tail -3
      grep -E '"warm\.(take|died|expired|start_failed)"|"launch\.end"' "$OUT/${part}_log.jsonl" | cut -c1-900 | head -40 ;;
    refs-pkb) refs refs_pkb pkb "$ALL" ;;
    refs-w2) refs refs_w2 pkb "$ALL" 2 ;;
    refs-large-a) refs refs_large_a large "$HALF_A" ;;
    refs-large-b) refs refs_large_b large "$HALF_B" ;;
    fidelity2) refs fidelity_2 pkb "$ALL" ;;
    fidelity3) refs fidelity_3 pkb "$ALL" ;;
    examples2) examples 2 ;;
    examples4) examples 4 ;;
    bench12)
      name=bench12_w${WS:-4}_j${LAUNCHES:-1}
      timeout 200 python3 bench/scripts/turnaround.py --out "$OUT/$name.jsonl" --parts bench12 \
        --world-size "${WS:-4}" --launches "${LAUNCHES:-1}" --device "${DEVICE:-cuda}" --log "$OUT/${name}_log.jsonl" | tail -4 ;;
    launches-a) LAUNCHES=${LAUNCHES:-4} refs "launches${LAUNCHES:-4}_${TAG:-1}_a" pkb "$HALF_A" | tail -22 ;;
    launches-b) LAUNCHES=${LAUNCHES:-4} refs "launches${LAUNCHES:-4}_${TAG:-1}_b" pkb "$HALF_B" | tail -22 ;;
    launches-noisy)
      for i in 1 2; do
        LAUNCHES=${LAUNCHES:-2} LIMIT=280 refs "launches_noisy_${i}" pkb "$NOISY_G" "${WS:-4}" | tail -14
      done ;;
    memo17)
      timeout 590 python3 bench/scripts/gpu_report.py --out "$OUT/memo17_w${WS:-2}.jsonl" --world-sizes "${WS:-2}" \
        --parts memo --memo-sizes pkb large --memo-repeats "${REPEATS:-2}" --device "${DEVICE:-cuda}" \
        > "$OUT/memo17_w${WS:-2}.log" 2>&1
      tail -20 "$OUT/memo17_w${WS:-2}.log" ;;
    refs17-a) refs "refs17_w${WS:-2}_a" pkb "$HALF_A" "${WS:-2}" | tail -22 ;;
    refs17-b) refs "refs17_w${WS:-2}_b" pkb "$HALF_B" "${WS:-2}" | tail -22 ;;
    refs-new) refs "refs_new_w${WS:-2}" "${SIZE:-pkb}" "${NEW:-23,24,26,30,33,34,35,36,37,38,39,54,55,56,57,58,65,66,69,71,72,74,75,76,77,80,82,83,84,86,87}" "${WS:-2}" | tail -30 ;;
    refs17-large) refs "refs17_w${WS:-2}_large" large 1,23,86 "${WS:-2}" | tail -8 ;;
    pytest17)
      timeout "$(limit 590)" python3 -m pytest -m gpu -q tests/test_gpu.py tests/test_adversarial_gpu.py \
        > "$OUT/pytest17.log" 2>&1
      tail -25 "$OUT/pytest17.log" ;;
    pytest-par)
      par="-n ${N:-4}"
      python3 -c "import xdist" 2>/dev/null || { par=""; echo "no pytest-xdist: one test at a time"; }
      PKB_PIN_CPUS=0 timeout "$(limit "${LIMIT:-590}")" python3 -m pytest -m gpu -q -rfEs $par --durations=10 \
        --junitxml="$OUT/pytest_par.xml" -k "not ($TIMED)" tests/test_gpu.py tests/test_adversarial_gpu.py \
        > "$OUT/pytest_par.log" 2>&1
      tail -25 "$OUT/pytest_par.log" ;;
    pytest-timed)
      timeout "$(limit "${LIMIT:-590}")" python3 -m pytest -m gpu -q -rfEs --durations=10 --junitxml="$OUT/pytest_timed.xml" \
        -k "$TIMED" tests/test_adversarial_gpu.py > "$OUT/pytest_timed.log" 2>&1
      tail -25 "$OUT/pytest_timed.log" ;;
    examples-new) examples "${WS:-2}" _072 072_; examples "${WS:-2}" _082 082_ ;;
    profile12)
      timeout "$(limit 200)" python3 bench/scripts/profile_tool_wall.py --world-size "${WS:-2}" \
        > "$OUT/profile_tool_wall.txt" 2>&1
      cat "$OUT/profile_tool_wall.txt"
      timeout "$(limit 200)" python3 -m pkb_mcp profile 12 examples/012_allgather_gemm_overlap.py \
        --world-size "${WS:-2}" --size pkb --device cuda > "$OUT/profile_p12_ex012_pkb.txt" 2>&1
      cat "$OUT/profile_p12_ex012_pkb.txt" ;;
    build-speed)
      name=build_speed_w${WS:-2}
      timeout "$(limit 590)" python3 bench/scripts/build_speed.py --out "$OUT/$name.jsonl" --world-size "${WS:-2}" \
        --files "${FILES:-10}" --repeats "${REPEATS:-5}" --log "$OUT/${name}_log.jsonl" \
        --stages ${STAGES:-first_build kernel_edit cached plain batch} ${NO_WARM:+--no-warm} ${SERVER:+--server} \
        ${SOLUTION:+--solution "$SOLUTION"} >> "$OUT/$name.log" 2>&1
      tail -10 "$OUT/$name.log" ;;
    warm-ext)
      name=warm_ext_w${WS:-2}${TAG:+_$TAG}
      timeout "$(limit 590)" python3 bench/scripts/turnaround.py --out "$OUT/$name.jsonl" --parts check \
        --world-size "${WS:-2}" --check-repeats "${REPEATS:-6}" --think-s "${THINK:-8}" --log "$OUT/${name}_log.jsonl" \
        --check-files ${FILES_CHECKED:-problems/001_allreduce.py tests/candidates/cpp_extension_lazy.py \
        tests/candidates/original_helper_cuda.py examples/001_allreduce_cuda_oneshot.py} > "$OUT/$name.log" 2>&1
      grep summary "$OUT/$name.log"
      grep -E '"warm\.take"' "$OUT/${name}_log.jsonl" | cut -c1-200 | tail -8
      grep -E '"launch\.end"' "$OUT/${name}_log.jsonl" | cut -c1-400 | tail -8
      python3 bench/scripts/launch_steps.py "$OUT/${name}_log.jsonl" | tee "$OUT/${name}_steps.json" ;;
    nvcc-phases)
      timeout "$(limit 590)" python3 bench/scripts/nvcc_phases.py --out "$OUT/nvcc_phases${TAG:+_$TAG}.jsonl" \
        --repeats "${REPEATS:-2}" ${NVCC_FILE:+--file "$NVCC_FILE" --variable "${NVCC_VARIABLE:-CUDA_SRC}"} \
        > "$OUT/nvcc_phases.log" 2>&1
      tail -6 "$OUT/nvcc_phases.log" | cut -c1-400 ;;
    nvcc-at-once)
      timeout "$(limit 590)" python3 bench/scripts/nvcc_phases.py --out "$OUT/at_once${TAG:+_$TAG}.jsonl" \
        --at-once "${AT_ONCE:-1,4,8}" --nice "${NICE:-0}" \
        ${NVCC_FILE:+--file "$NVCC_FILE" --variable "${NVCC_VARIABLE:-CUDA_SRC}"} >> "$OUT/at_once.log" 2>&1
      tail -8 "$OUT/at_once.log" | cut -c1-400 ;;
    gpu-step)
      name=gpu_step${TAG:+_$TAG}
      timeout "$(limit 300)" python3 bench/scripts/gpu_step.py --out "$OUT/$name.jsonl" \
        --repeats "${REPEATS:-2}" --counts "${COUNTS:-1,2,4,6}" ${DOCKER:+--docker} ${ANATOMY_ONLY:+--anatomy-only} \
        --disturbances "${DISTURBANCES:-none,context,group,step}" \
        ${NCCL_LOG:+--nccl-log "$OUT/${name}_nccl"} > "$OUT/$name.log" 2>&1
      tail -14 "$OUT/$name.log" | cut -c1-400 ;;
    ray-batch) ray_batch ;;
    nvlink-probe) nvlink_probe ;;
    nvlink-oneshot) for size in pkb large; do nvlink_profile "p1_oneshot_$size" examples/001_allreduce_cuda_oneshot.py "$size"; done ;;
    nvlink-copy) for size in pkb large; do nvlink_profile "p1_copy_engine_$size" examples/001_allreduce_copy_engine.py "$size"; done ;;
    nvlink-ref) for size in pkb large; do nvlink_profile "p1_reference_$size" problems/001_allreduce.py "$size"; done ;;
    nvlink-pytest)
      timeout "$(limit 590)" python3 -m pytest -m gpu -q -rfEs tests/test_profile.py -k nvlink \
        > "$OUT/nvlink_pytest.log" 2>&1
      tail -30 "$OUT/nvlink_pytest.log" ;;
    side-by-side-a) side_by_side 1 ;;
    side-by-side-b) side_by_side 2 ;;
    side-by-side-c) side_by_side 3 ;;
    side-by-side-d) side_by_side 4 ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
  echo "part $part: end $(date -u +%FT%TZ)" >> "$OUT/parts.txt"
  [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$OUT" --exclude turnaround-state .
done
# the MCP server's state (its job store, the sources it was sent) is no result, and the device tool
# returns only a limited number of files
rm -rf "$OUT/turnaround-state"
