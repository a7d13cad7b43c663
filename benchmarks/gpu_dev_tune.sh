#!/usr/bin/env bash
# One native-kernel tuning call on the GPU runner: build the native families from csrc/ (and each
# sm80 tile variant, in parallel), check and time them on the chosen cases, then show where the
# default build's time goes (torch.profiler per kernel, ncu stall reasons). Logs and JSON packed
# into $OUT/tune.tgz (the transfer back takes few files); a short table printed last, then each
# variant against the default build (gpu_dev_native.variant_summary: time ratios per case, geomean,
# ACCURACY verdict).
#
#   VARIANTS=$'mt1=-DSAGE_HD64_MT=1 -DSAGE_HD64_WARPS=8\nqreg=-DSAGE_HD64_QREG=1' \
#   CASES=4x32x4096x128,4x32x4096x64 LABELS=sm80-fp32 NCU=1 bash benchmarks/gpu_dev_tune.sh
#
# Environment: OUT, VARIANTS (NAME=DEFINES lines, see csrc/common/attn_dispatch.cuh),
# VARIANT_CSRC (NAME=DIR lines: build variant NAME from the csrc/ tree DIR, e.g. the kernels of
# another commit for an A/B in one call: git archive REV csrc | tar -x -C DIR/..), CASES,
# CAUSAL (both|no|yes), LABELS (benchmarks/gpu_dev_native.py KERNELS), FAMILIES (default sm80),
# TESTS (1: also run tests/gpu/test_native_sm80_sm89.py), DTYPES (default float16), PROFILE_CASES, NCU (1: run ncu on
# PROFILE_CASES), NCU_LABEL, NCU_METRICS (extra ncu --metrics, e.g. the stall reasons:
# regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio), ARCH (TORCH_CUDA_ARCH_LIST
# for every build, default 9.0; 9.0a for the wgmma variants: -DSAGE_WGMMA=1), VARIANT_TESTS (a
# variant NAME: also run the sm80 tests of tests/gpu/test_native_sm80_sm89.py on its build),
# PROFILE_VARIANT (a variant NAME: the breakdown and ncu steps run its build), NCU_KERNEL (regex
# of the kernel ncu profiles, default attn_kernel; attn_wgmma for the wgmma variants),
# VARIANT_FAMILY (lines of [NAME=]FAMILY: the family the variants build, all or one by name:
# sm80, default, sm89 for the FP8 wgmma variant, sm90 / sm90_fp8 for the shipped Hopper families
# with their own tiles; VARIANT_TESTS runs tests/gpu/test_native_sm80_sm89.py -k VARIANT_TESTS_K,
# default sm80), RATE (1: also build and run benchmarks/gpu_dev_wgmma_rate.cu, sm_90a, within
# LIMIT_RATE seconds, default 120; its output is printed last), VARIANT_TIMEOUT (seconds each
# variant's check and timing may take before it is killed, default 150: a hang costs one variant),
# MMA_PEAK (0: skip the mma.sync ceiling at the start), BREAKDOWN (0: skip the per-kernel breakdown).
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
OUT=${OUT:-$PWD/tune_out}
mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
CASES=${CASES:-4x32x4096x128,1x32x16384x128,4x32x4096x64,1x32x16384x64,8x32x1024x128}
PROFILE_CASES=${PROFILE_CASES:-4x32x4096x128 4x32x4096x64}
variant_args=()
while IFS= read -r v; do [ -n "$v" ] && variant_args+=(--variant "$v"); done <<<"${VARIANTS:-}"
while IFS= read -r v; do [ -n "$v" ] && variant_args+=(--variant-csrc "$v"); done <<<"${VARIANT_CSRC:-}"
while IFS= read -r v; do [ -n "$v" ] && variant_args+=(--variant-family "$v"); done <<<"${VARIANT_FAMILY:-sm80}"

nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm --format=csv,noheader
# the mma.sync ceiling every native family lives under on this GPU
[ "${MMA_PEAK:-1}" = 1 ] &&
  timeout 120 python3 benchmarks/gpu_dev_mma_peak.py --json "$OUT/mma_peak.json" >"$OUT/mma_peak.log" 2>&1
fam_args=(); for f in ${FAMILIES:-sm80}; do fam_args+=(--family "$f"); done
test_args=(--skip-tests); [ "${TESTS:-0}" = 1 ] && test_args=()
[ "${SKIP_NATIVE:-0}" = 1 ] || timeout "${LIMIT_NATIVE:-420}" python3 benchmarks/gpu_dev_native.py "${fam_args[@]}" "${test_args[@]}" \
  --dtypes "${DTYPES:-float16}" --cases "$CASES" --causal "${CAUSAL:-no}" --labels "${LABELS:-sm80-fp32}" \
  --build-root /tmp/native_build --out "$OUT/native" --arch "${ARCH:-9.0}" --variant-timeout "${VARIANT_TIMEOUT:-150}" \
  "${variant_args[@]}" >"$OUT/native.log" 2>&1
echo "native: exit $?"
if [ -n "${VARIANT_TESTS:-}" ]; then
  PYTHONPATH=/tmp/native_build/pkg_${VARIANT_TESTS} timeout "${LIMIT_VARIANT_TESTS:-200}" python3 -m pytest -q \
    tests/gpu/test_native_sm80_sm89.py -k "${VARIANT_TESTS_K:-sm80}" -p no:cacheprovider --tb=short -x >"$OUT/variant_tests.log" 2>&1
  echo "variant ${VARIANT_TESTS} tests: exit $? ($(tail -n 1 "$OUT/variant_tests.log"))"
fi
cp /tmp/native_build/build_*.log "$OUT/" 2>/dev/null
if [ "${RATE:-0}" = 1 ]; then
  "$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I csrc -o /tmp/wgmma_rate \
    benchmarks/gpu_dev_wgmma_rate.cu >"$OUT/wgmma_rate.log" 2>&1 &&
    timeout "${LIMIT_RATE:-120}" /tmp/wgmma_rate >>"$OUT/wgmma_rate.log" 2>&1
  echo "wgmma rate: exit $?"
fi
pcases=(); for c in $PROFILE_CASES; do pcases+=(--case "$c"); done
[ -n "${PROFILE_VARIANT:-}" ] && export SAGE_DEV_PACKAGE_ROOT=/tmp/native_build/pkg_${PROFILE_VARIANT}
[ "${BREAKDOWN:-1}" = 1 ] && timeout 120 python3 benchmarks/gpu_dev_profile.py breakdown "${pcases[@]}" \
  --label "${NCU_LABEL:-sm80-fp32}" >"$OUT/breakdown.log" 2>&1
if [ "${NCU:-0}" = 1 ]; then
  for c in $PROFILE_CASES; do
    timeout 150 ncu --clock-control none -k "regex:${NCU_KERNEL:-attn_kernel}" -c 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section InstructionStats \
      --section MemoryWorkloadAnalysis ${NCU_METRICS:+--metrics "$NCU_METRICS"} \
      python3 benchmarks/gpu_dev_profile.py drive --case "$c" --calls 1 \
      --label "${NCU_LABEL:-sm80-fp32}" >"$OUT/ncu_$c.txt" 2>&1
    echo "ncu $c: exit $?"
  done
fi
# the transfer back takes few files: pack everything
# (packed outside $OUT, in a file of its own: two calls on one machine must not share it)
packed=$(mktemp "${TMPDIR:-/tmp}/tune.XXXXXX.tgz")
tar -C "$OUT" -czf "$packed" . && rm -rf "${OUT:?}"/* && mv "$packed" "$OUT/tune.tgz"
[ "${MMA_PEAK:-1}" = 1 ] && tar -xzOf "$OUT/tune.tgz" ./mma_peak.log
[ "${BREAKDOWN:-1}" = 1 ] && tar -xzOf "$OUT/tune.tgz" ./breakdown.log
tar -xzOf "$OUT/tune.tgz" ./native.log | grep -E "TOPS|geomean|== variant|failed|Error|pytest:|FAILED|ACCURACY" | tail -n 70
# the variants against the default build, one table (gpu_dev_native.variant_summary)
tar -xzOf "$OUT/tune.tgz" ./native.log | sed -n '/^== variants against the default build/,$p'
[ "${RATE:-0}" = 1 ] && tar -xzOf "$OUT/tune.tgz" ./wgmma_rate.log | tail -n 40
exit 0
