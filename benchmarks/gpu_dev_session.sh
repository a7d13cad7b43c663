#!/usr/bin/env bash
# One development call on the GPU runner: build the runner's sm90 wheel (kernel objects from a
# carried cache), install it, then run the chosen steps, each under its own time limit, with logs
# and JSON under $OUT/s/ packed into $OUT/session.tgz (the transfer takes few files, no '+').
#
#   STEPS="tests hopper triton bench calibrate" bash benchmarks/gpu_dev_session.sh
#
# Steps: tests (pytest tests/gpu), fuzz (pytest tests/gpu/test_fuzz_gpu.py alone, on the draw that
# FUZZ_SEED and FUZZ_CASES name, e.g. FUZZ_SEED=32 FUZZ_CASES=200), hopper (benchmarks/gpu_dev_hopper.py --sweep), triton
# (benchmarks/gpu_dev_triton.py --sweep), bench (python -m sageattention.benchmark, every backend),
# breakdown (CUDA time per kernel of one native call: BREAKDOWN_LABELS, BREAKDOWN_CASES; then the
# ATen mean and aminmax over tokens on the same cases, gpu_dev_profile.py aten-stats),
# calibrate (python -m sageattention.calibrate), table (ship what calibrate measured: rebuild the
# table from its raw JSON under benchmarks/results/ into sageattention/calibration/$TABLE_FILE,
# default sm90.json, e.g. TABLE_FILE=sm90-nvidia-h200.json for that GPU model's own, and rebuild +
# reinstall the wheel), validate
# (scripts.factory.validate on the wheel), sm75 / sm80 / sm89 (build that SM's wheel of CELL's
# python/torch/cuda and validate it through its PTX on this GPU; validation installs it into a folder
# of its own, so the sm90 wheel stays the installed one), clocks (SM clock,
# power and clock-event reasons per backend under load, benchmarks/gpu_dev_clocks.py CLOCKS_ARGS).
# Environment: OUT, STEPS, TEST_FILES (what the tests step runs, paths from the repository root; default tests/gpu), TABLE_FILE, CLOCKS_ARGS, FUZZ_SEED, FUZZ_CASES, BENCH_ARGS (more arguments of the bench step, e.g. --rounds 3
# --markdown FILE), LIMIT_<STEP> (seconds, e.g. LIMIT_TESTS=150), DEADLINE (seconds for all
# steps, default 560: a step gets at most what is left), TEST_WORKERS (pytest-xdist, default 8), CELL (default linux-cp312-torch2.11-cu130-sm90), SAGEATTENTION_KERNEL_CACHE.
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
OUT=${OUT:-$PWD/runner_out}
S=$OUT/s
mkdir -p "$S"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CELL=${CELL:-linux-cp312-torch2.11-cu130-sm90}
STEPS=${STEPS-tests hopper triton bench}  # STEPS="" builds and installs only
summary=()
t() { local name=$1 limit=$2; shift 2; local start=$SECONDS
  local var="LIMIT_${name^^}"; limit=${!var:-$limit}   # e.g. LIMIT_TESTS=150
  local left=$(( ${DEADLINE:-560} - SECONDS ))   # the whole call must end in time to pack $S
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -le 5 ]; then summary+=("$name: skipped, past DEADLINE"); return 124; fi
  timeout "$limit" "$@" >"$S/$name.log" 2>&1; local rc=$?
  summary+=("$name: exit $rc in $((SECONDS - start)) s (limit $limit s)"); tail -n 25 "$S/$name.log"
  return $rc; }

# The device copy of the tree has no .git: pass the commit (SOURCE_COMMIT=$(git rev-parse HEAD),
# expanded where the command is written) so the wheels' build info names it.
if [ -z "${SOURCE_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "note: no .git and no SOURCE_COMMIT: build info will say 'commit unknown'"
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$S/gpu.txt"
t build 300 python3 -m scripts.factory build --cell "$CELL" --no-repair --out "$S/wheel"
WHEEL=$(ls "$S"/wheel/*.whl 2>/dev/null | head -n 1)
if [ -n "$WHEEL" ]; then
  t install 120 python3 -m pip install --no-deps --no-index --force-reinstall "$WHEEL"
fi
cd /tmp   # import the installed wheel, not the source tree
REPO=$OLDPWD
xdist=(); python3 -c 'import xdist' 2>/dev/null && xdist=(-n "${TEST_WORKERS:-8}")  # the pytest steps: parallel Triton compiles
for step in $STEPS; do
  case $step in
    tests) files=(); for f in ${TEST_FILES:-tests/gpu}; do files+=("$REPO/$f"); done   # e.g. TEST_FILES="tests/gpu/test_triton.py"
           t tests 240 python3 -m pytest "${files[@]}" -q -rs "${xdist[@]}" --junitxml="$S/tests.xml" -p no:cacheprovider ;;
    fuzz)  # the fuzz tier alone on the draw FUZZ_SEED / FUZZ_CASES name (tests/gpu/fuzz_cases.py's
           # SAGE_FUZZ_SEED / SAGE_FUZZ_CASES, set for this step only: the tests step keeps the default)
           echo "fuzz draw: SAGE_FUZZ_SEED=${FUZZ_SEED:-} SAGE_FUZZ_CASES=${FUZZ_CASES:-} (empty: the default)" | tee "$S/fuzz_draw.txt"
           SAGE_FUZZ_SEED=${FUZZ_SEED:-} SAGE_FUZZ_CASES=${FUZZ_CASES:-} t fuzz 240 python3 -m pytest \
             "$REPO/tests/gpu/test_fuzz_gpu.py" -q -rs "${xdist[@]}" --junitxml="$S/fuzz.xml" -p no:cacheprovider ;;
    hopper) t hopper 240 python3 "$REPO/benchmarks/gpu_dev_hopper.py" --sweep --out "$S" ;;
    triton) t triton 240 python3 "$REPO/benchmarks/gpu_dev_triton.py" --sweep --out "$S/triton" ;;
    bench) # after calibrate: sageattn dispatches with the table just measured
           if [ -f "$S/sm90.json" ]; then export SAGEATTENTION_CALIBRATION=$S/sm90.json; fi
           t bench 240 python3 -m sageattention.benchmark --json "$S/bench.json" ${BENCH_ARGS:-} ;;
    calibrate) # 352 s for the 80-shape grid on an H100 (5b7cdab): its own limit, before DEADLINE's
               t calibrate 420 python3 -m sageattention.calibrate --out "$S/sm90.json" \
                 --benchmark-json "$S/calibration-benchmark.json" ;;
    table) # the table calibrate just measured, rebuilt from its raw JSON at the path it will be
           # committed under (so the shipped file is byte-identical), then the wheel rebuilt with it
           # named after the card that measured it (h100-/h200-...) and the commit (two calls of
           # one day must not share a name), unless TABLE_SOURCE says
           card=$(sed -n '1s/.*\(H[0-9]\{3\}\).*/\1/p' "$S/gpu.txt" | tr 'H' 'h')
           src=benchmarks/results/${TABLE_SOURCE:-${card:-gpu}-$(date +%F)-calibration${SOURCE_COMMIT:+-${SOURCE_COMMIT:0:7}}.json}
           cd "$REPO"
           cp "$S/calibration-benchmark.json" "$src" &&
             t table 60 python3 -m sageattention.calibrate --from-benchmark "$src" \
               --out "sageattention/calibration/${TABLE_FILE:-sm90.json}" &&
             cp "sageattention/calibration/${TABLE_FILE:-sm90.json}" "$S/" && rm -rf "$S/wheel" &&
             t rebuild 200 python3 -m scripts.factory build --cell "$CELL" --no-repair --out "$S/wheel" &&
             WHEEL=$(ls "$S"/wheel/*.whl | head -n 1) &&
             t reinstall 60 python3 -m pip install --no-deps --no-index --force-reinstall "$WHEEL"
           cd /tmp ;;
    breakdown) # CUDA time per kernel of one call of the installed wheel's ops (benchmarks/gpu_dev_profile.py)
           pkg=$(python3 -c 'import os, sageattention; print(os.path.dirname(os.path.dirname(sageattention.__file__)))')
           cases=(); for c in ${BREAKDOWN_CASES:-4x32x4096x128 8x32x1024x128 4x32x4096x64}; do cases+=(--case "$c"); done
           t breakdown 150 env SAGE_DEV_PACKAGE_ROOT="$pkg" bash -c 'labels=$1; shift; for lab in $labels; do
               python3 "$0/benchmarks/gpu_dev_profile.py" breakdown --label "$lab" "$@" || exit 1; done' \
             "$REPO" "${BREAKDOWN_LABELS:-sm90-fp32 sm90_fp8-fp32+fp32}" "${cases[@]}"
           t aten_stats 60 env SAGE_DEV_PACKAGE_ROOT="$pkg" python3 "$REPO/benchmarks/gpu_dev_profile.py" aten-stats \
             "${cases[@]}" ;;
    validate) cd "$REPO"   # scripts.factory lives in the tree; the suite itself runs the installed wheel
              t validate 400 python3 -m scripts.factory.validate --system --quick --out-dir "$S/reports" \
                --wheel "$WHEEL"
              cd /tmp ;;
    clocks) t clocks 150 python3 "$REPO/benchmarks/gpu_dev_clocks.py" --json "$S/clocks.json" ${CLOCKS_ARGS:-} ;;
    sm75|sm80|sm89) # that SM's wheel, validated here through its embedded PTX (compute_75 for
          # Turing: that code path, not that hardware); the installed sm90 wheel stays installed
          cd "$REPO"; sm=${step#sm}
          t "build$sm" 200 python3 -m scripts.factory build --cell "${CELL%-sm90}-$step" --no-repair \
              --out "$S/wheel$sm" &&
            t "validate$sm" 300 python3 -m scripts.factory.validate --system --quick --out-dir "$S/reports" \
              --wheel "$(ls "$S/wheel$sm"/*.whl | head -n 1)"
          cd /tmp ;;
    *) summary+=("$step: unknown step") ;;
  esac
done
# '+' is refused by the transfer: rename, then pack everything into one archive.
find "$S" -name '*+*' | while read -r f; do mv "$f" "${f//+/_PLUS_}"; done
tar -C "$OUT" -czf "$OUT/session.tgz" s && rm -rf "$S"
printf '%s\n' "${summary[@]}"
