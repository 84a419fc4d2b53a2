#!/usr/bin/env bash
# Runs each tests/test_*.py in its own pytest process (4 at a time), GPU tests required, so a crash in one file
# cannot hide the results of the others; then the exclusive_gpu tests (they read device-wide free memory) alone.
# Usage: scripts/gpu_test_files.sh OUT_DIR [pytest args...]
set -uo pipefail
OUT=${1:?usage: scripts/gpu_test_files.sh OUT_DIR [pytest args...]}
shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT/files"
export PYTHONPATH=$PWD/python GE2_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 PYTEST_ARGS="$*"
ls tests/test_*.py | xargs -P 4 -I{} bash -c \
  'f={}; name=$(basename $f .py); python3 -m pytest $f -q -p no:cacheprovider -rf -m "not exclusive_gpu" $PYTEST_ARGS > '"$OUT"'/files/$name.log 2>&1; code=$?; [ $code -eq 5 ] && code=0; echo "$name exit=$code"' |
  sort >"$OUT/files_summary.txt"
python3 -m pytest tests -q -p no:cacheprovider -rf -m exclusive_gpu $PYTEST_ARGS >"$OUT/files/exclusive_gpu.log" 2>&1
echo "exclusive_gpu exit=$?" >>"$OUT/files_summary.txt"
for log in "$OUT"/files/*.log; do
  echo "== $(basename "$log" .log): $(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$log" | tail -1)"
done | tee -a "$OUT/files_summary.txt"
grep -h -E "^FAILED|Fatal Python error|Segmentation" "$OUT"/files/*.log | cut -c1-240 >"$OUT/failures.txt"
cat "$OUT"/files/*.log >"$OUT/all_test_logs.txt"
! grep -q "exit=[^0]" "$OUT/files_summary.txt"
