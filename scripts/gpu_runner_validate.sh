#!/usr/bin/env bash
# One call on the GPU runner (no nox, no network): build wheels for the given matrix cells in
# parallel, validate each against the GPU, and leave reports and logs in $OUT.
#
#   bash scripts/gpu_runner_validate.sh CELL_ID [CELL_ID ...]
#   e.g. bash scripts/gpu_runner_validate.sh linux-cp312-torch2.11-cu130-sm90 linux-cp312-torch2.11-cu130-sm75
#
# Environment: OUT (default ./runner_out), PYTHON (default python3), VALIDATE_ARGS (extra arguments
# for scripts.factory.validate, default --quick), DEADLINE (seconds from the start by which every
# validation must end, default 1800; each wheel gets a share of what is left, the first ones a little more).
# Reports land in $OUT as <wheel stem>.report.json; copy them to release_notes/ and run
# `nox -s notes` (or `python -m scripts.factory.notes`) to regenerate the notes.
set -uo pipefail
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; }   # the comment above
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ $# -gt 0 ] || { usage; exit 2; }
OUT=${OUT:-$PWD/runner_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PYTHON:-python3}
WHEELS=$(mktemp -d)
cores=$(nproc)
export MAX_JOBS=${MAX_JOBS:-$(( cores / $# > 0 ? cores / $# : 1 ))}
summary=()

# The device copy of the tree has no .git: pass the commit (SOURCE_COMMIT=$(git rev-parse HEAD),
# expanded where the command is written) so the wheels' build info names it.
if [ -z "${SOURCE_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "note: no .git and no SOURCE_COMMIT: build info will say 'commit unknown'"
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
declare -A pids started
for cell in "$@"; do           # builds run side by side: each one is mostly single-threaded nvcc
  "$PY" -m scripts.factory build --cell "$cell" --no-repair --out "$WHEELS/$cell" \
    >"$OUT/build-${cell}.log" 2>&1 &
  pids[$cell]=$!; started[$cell]=$SECONDS
done
for cell in "$@"; do
  if wait "${pids[$cell]}"; then
    summary+=("$cell: built in $((SECONDS - started[$cell])) s")
  else
    summary+=("$cell: BUILD FAILED (build-${cell}.log)"); tail -25 "$OUT/build-${cell}.log"
  fi
done
shopt -s nullglob
todo=("$WHEELS"/*/*.whl)
left=${#todo[@]}
for cell in "$@"; do
  for whl in "$WHEELS/$cell"/*.whl; do
    start=$SECONDS
    # the first wheels get a little more than an even share: the primary build comes first
    share=$(( (${DEADLINE:-1800} - SECONDS) * 3 / (3 + 2 * (left - 1)) )); left=$((left - 1))
    [ "$share" -gt 10 ] || { summary+=("$cell: no time left to validate"); continue; }
    # shellcheck disable=SC2086  # VALIDATE_ARGS is a list of flags
    timeout "$share" "$PY" -m scripts.factory.validate --system \
      ${VALIDATE_ARGS---quick} --out-dir "$OUT" --wheel "$whl" >"$OUT/validate-${cell}.log" 2>&1
    rc=$?
    summary+=("$cell: validate exit $rc in $((SECONDS - start)) s of $share s ($(basename "$whl"))")
    tail -15 "$OUT/validate-${cell}.log"
  done
done
ls -la "$OUT"
printf '%s\n' "${summary[@]}"
